"""The stage contract (module_utils/stage_contract.py): every stage's fact is
written with the schema version and the keys the next stages rely on, and read
back only when it was written under this schema; and every role goes through it."""
import re

import paths
import pytest

paths.use_module_utils()
from ansible.module_utils import stage_contract as C  # noqa: E402

ROLES = paths.ROOT / "roles"


def test_a_written_fact_carries_the_schema_and_the_stage():
    record = C.fact_record({"plans": [], "summary": "x"}, "model")
    assert record["schema_version"] == C.SCHEMA_VERSION and record["stage"] == "model"
    assert C.fact_path("model") == "/etc/ansible/facts.d/llm_fleet_model.fact"


def test_a_fact_without_a_promised_key_is_not_written():
    with pytest.raises(C.StageContractError, match="lacks instances"):
        C.fact_record({"host": "127.0.0.1", "api_key": False, "api_key_file": "", "environment": {}, "summary": ""},
                      "llama_server")
    with pytest.raises(C.StageContractError, match="not a stage"):
        C.fact_record({}, "vllm")


def test_a_reader_gets_the_fact_or_nothing():
    fact = C.fact_record({"plans": [1], "summary": ""}, "model")
    assert C.stage_fact({"llm_fleet_model": fact}, "model") == fact
    assert C.stage_fact({}, "model") == {} and C.stage_fact(None, "model") == {}


@pytest.mark.parametrize("version,word", [(None, "an older"), (0, "an older"), (C.SCHEMA_VERSION + 1, "a newer")])
def test_a_fact_of_another_schema_is_refused_with_the_fix(version, word):
    fact = {"plans": [], "summary": ""}
    if version is not None:
        fact["schema_version"] = version
    with pytest.raises(C.StageContractError, match="written by %s llm-fleet. Rerun the model stage" % word):
        C.stage_fact({"llm_fleet_model": fact}, "model")


def test_no_role_names_a_fact_file_or_reads_ansible_local_directly():
    """One place for the contract: roles go through the llm_fleet_* filters."""
    offenders = []
    for path in sorted(ROLES.rglob("*.yml")) + sorted(ROLES.rglob("*.j2")):
        if path.name == "argument_specs.yml":  # documentation
            continue
        text = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
        if re.search(r"llm_fleet_\w+\.fact|facts\.d|\['ansible_local'\]\['llm_fleet_", text):
            offenders.append(str(path.relative_to(paths.ROOT)))
    assert offenders == []
