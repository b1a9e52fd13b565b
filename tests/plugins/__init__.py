"""The suite's machinery, one pytest plugin per job; tests/conftest.py lists them in `pytest_plugins`."""
