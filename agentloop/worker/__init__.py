"""Celery app and its tasks: thin wrappers that take ids and call agent/ or learner/."""
