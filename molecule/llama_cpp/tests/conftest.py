import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "harness"))


def pytest_configure(config):
    # `make test` (CI's 90 minutes) leaves these out; `make test DAY_TWO=1` and `make molecule` run them.
    config.addinivalue_line("markers", "day_two: slow day-two test (a whole rollout, rebuild or redeploy)")
