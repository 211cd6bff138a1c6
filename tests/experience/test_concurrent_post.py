import threading

import pytest
from django.db import connection
from rest_framework.test import APIClient

from experience.models import Experience
from tests.experience.factories import experience_json


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("rounds", [20])
def test_concurrent_posts_of_one_new_id_both_get_the_stored_row(api_key, rounds):
    """Two clients POST the same new id at the same moment (a retry racing its original):
    one stores it, the other gets the stored row; neither sees a 500."""
    # One request first: loading the middleware registers metrics once per process, and two
    # clients loading it at once would race on that registration, not on the POST.
    APIClient().get("/health")
    for number in range(rounds):
        payload = experience_json(id=f"race-{number}")
        start = threading.Barrier(2)
        answers: list[tuple[int, dict]] = []

        def post(
            body: dict = payload, start: threading.Barrier = start, answers: list = answers
        ) -> None:
            client = APIClient()
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key[1]}")
            try:
                start.wait()
                response = client.post("/experience/", body, format="json")
                answers.append((response.status_code, response.json()))
            finally:
                connection.close()

        threads = [threading.Thread(target=post) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(code for code, _ in answers) == [200, 201], answers
        assert answers[0][1] == answers[1][1]
    assert Experience.objects.count() == rounds
