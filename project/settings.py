"""Settings of the BackWave demo project (django-environ: every value can come from the environment)."""

from pathlib import Path

import environ

from project.secret_key import secret_key_from_file

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env(DEBUG=(bool, False), ALLOWED_HOSTS=(list, ["localhost", "127.0.0.1", "[::1]"]))

# Never a default in the source (run tokens are signed with it): the environment's, else one
# generated for this checkout on first use and kept in a git-ignored file (project/secret_key.py).
SECRET_KEY = env.str("SECRET_KEY", default="") or secret_key_from_file(
    env.str("SECRET_KEY_FILE", default=str(BASE_DIR / ".secret_key"))
)
DEBUG = env("DEBUG")
ALLOWED_HOSTS = env("ALLOWED_HOSTS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django.contrib.postgres",
    "backwave",
    "project.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Serves STATIC_ROOT (filled by collectstatic) from gunicorn itself: the demo needs no web server in front.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

WSGI_APPLICATION = "project.wsgi.application"
ASGI_APPLICATION = "project.asgi.application"

if env.str("DATABASE_URL", default=""):
    from project.database import url_database_config

    DATABASES = {"default": url_database_config(env, env.str("DATABASE_URL"))}
else:
    from project.database import embedded_database_config

    DATABASES = {"default": embedded_database_config()}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

TASKS = {"default": {"BACKEND": "backwave.backend.BackWaveBackend", "QUEUES": ["default", "emails", "reports", "bench"]}}

# The benchmarks (bench/) and the tests run workers of their own with --queues for the queues
# that the demo's worker group leaves alone ("bench", and the tests' own).
SILENCED_SYSTEM_CHECKS = ["backwave.W002"]

BACKWAVE = {
    # The benchmarks compare both commit modes of the worker's bookkeeping; unset, BackWave's default.
    **(
        {"WORKER_SYNCHRONOUS_COMMIT": env.bool("BACKWAVE_WORKER_SYNCHRONOUS_COMMIT")}
        if env.str("BACKWAVE_WORKER_SYNCHRONOUS_COMMIT", default="")
        else {}
    ),
    # The bearer token Prometheus sends to /backwave/metrics; unset, only staff may read it.
    **({"METRICS_TOKEN": env.str("BACKWAVE_METRICS_TOKEN")} if env.str("BACKWAVE_METRICS_TOKEN", default="") else {}),
    "WORKER_GROUPS": [{"name": "default", "queues": ["default", "emails", "reports"], "pool_size": 16}],
    # So the admin's Schedules page shows a schedule at work: every worker writes it at start and
    # maintenance mints one report job per slot.
    "SCHEDULES": {"demo-report": {"task": "project.demo.tasks.report_job", "cron": "*/5 * * * *", "queue": "reports"}},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "backwave": {"handlers": ["console"], "level": env.str("BACKWAVE_LOG_LEVEL", default="INFO")},
        "django.tasks": {"handlers": ["console"], "level": "WARNING"},
    },
}
