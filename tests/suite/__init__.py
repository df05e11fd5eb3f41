"""The package as a whole, on every backend: the conformance suite, the README, inputs, secrets, operators, events,
Celery."""
