"""What a gunicorn worker does as it boots, before its first request."""

import pytest

from .live_server import live_server


@pytest.mark.live_server
def test_the_web_workers_make_and_load_the_query_model_before_the_first_search(tmp_path):
    """No client's first search waits for the model (gunicorn.conf.py's post_worker_init):
    the int8 query model is made in the data folder before any search asked for it."""
    with live_server(tmp_path):
        assert (tmp_path / "models" / "minilm-l6-v2-int8-matmuls.onnx").exists()
    assert "did not load" not in (tmp_path / "gunicorn.log").read_text()
