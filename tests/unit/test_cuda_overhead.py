"""The planner's per-process CUDA overhead, per CUDA major (module_utils/plan_memory.py).

Measured on CUDA 13 only (an H200); 11.x and 12.x assume the same value until a
V100 with CUDA 11.8 is measured, so every plan is unchanged by the lookup."""
import ansible.module_utils
import pytest

from conftest import ROOT

if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
from ansible.module_utils import llama_plan as lp, plan_memory  # noqa: E402


def test_every_known_major_has_the_measured_value_for_now():
    assert plan_memory.CUDA_OVERHEAD_BYTES == 576 * plan_memory.MIB
    assert sorted(plan_memory.CUDA_OVERHEAD_MIB_BY_MAJOR) == [11, 12, 13]
    assert set(plan_memory.CUDA_OVERHEAD_MIB_BY_MAJOR.values()) == {576}


@pytest.mark.parametrize("version", [None, "", "11.8", "11.7", "12.2", "13.0", 13, "14.1", "10.2"])
def test_lookup(version):
    assert plan_memory.cuda_overhead_bytes(version) == plan_memory.CUDA_OVERHEAD_BYTES


def test_a_major_outside_the_table_takes_the_nearest(monkeypatch):
    monkeypatch.setattr(plan_memory, "CUDA_OVERHEAD_MIB_BY_MAJOR", {11: 700, 12: 600, 13: 576})
    assert plan_memory.cuda_overhead_bytes("10.2") == 700 * plan_memory.MIB
    assert plan_memory.cuda_overhead_bytes("11.8") == 700 * plan_memory.MIB
    assert plan_memory.cuda_overhead_bytes("14.0") == 576 * plan_memory.MIB


def test_the_default_policy_uses_the_constant():
    assert lp.DEFAULT_POLICY["overhead_bytes"] == plan_memory.CUDA_OVERHEAD_BYTES


def test_a_bad_version_is_refused():
    with pytest.raises(plan_memory.PlanError):
        plan_memory.cuda_overhead_bytes("cuda")
