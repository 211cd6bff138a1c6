FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 FERRUM_DATA_DIR=/data
WORKDIR /app

COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt

COPY . .
# A throwaway key for collectstatic only: the image must not carry a secret.
RUN DJANGO_SECRET_KEY=collectstatic-only python manage.py collectstatic --noinput --verbosity 0 \
    && rm -rf /data/secret_key

EXPOSE 8000
CMD ["gunicorn", "ferrum_memory.wsgi:application", "--config", "gunicorn.conf.py"]
