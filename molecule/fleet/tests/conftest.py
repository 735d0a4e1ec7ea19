import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "harness"))

from hostprobe import sim_profile  # noqa: E402,F401  (pytest fixture)


def pytest_configure(config):
    # `make test` (CI's 90 minutes) leaves these out; `make test DAY_TWO=1` and `make molecule` run them.
    config.addinivalue_line("markers", "day_two: slow day-two test (a whole rollout, rebuild or redeploy)")


def _group_hosts(inventory, group):
    """The hosts of a group anywhere in a YAML inventory (molecule's own)."""
    found = set()
    if isinstance(inventory, dict):
        for key, value in inventory.items():
            if key == group and isinstance(value, dict):
                found |= set(value.get("hosts") or {})
            found |= _group_hosts(value, group)
    return found


def pytest_collection_modifyitems(config, items):
    """testinfra's `host` runs a test on every host of the inventory; a fleet front (group
    fleet_fronts) is no GPU server: only the tests that name it run there."""
    import yaml
    path = os.environ.get("MOLECULE_INVENTORY_FILE", "")
    if not os.path.exists(path):
        return
    with open(path) as handle:
        fronts = _group_hosts(yaml.safe_load(handle), "fleet_fronts")
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        target = callspec.params.get("_testinfra_host") if callspec else None
        name = target.backend.get_hostname() if target is not None else None
        (drop if name in fronts else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
