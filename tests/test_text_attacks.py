"""``dager`` and ``tag`` as audit attacks on real Shakespeare windows: what the server reads
from a probe (exact sentences below the rank limit), nothing from another client's gradient,
one-line refusals where they cannot apply, and the text scores they are recorded with."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pandas as pd
import pytest
import torch
from rich.console import Console

from fedsim.attacks.base import AttackSetting
from fedsim.attacks.registry import resolve_attack
from fedsim.audit.experiment import Probe, gradient_probe
from fedsim.audit.records import AuditLog
from fedsim.audit.scoring import TaskRun
from fedsim.audit.tasks import DeviceUse
from fedsim.cli import main
from fedsim.core.config import DataConfig, ModelConfig
from fedsim.core.data import DatasetBundle, load_dataset
from fedsim.core.modality import input_spec
from fedsim.core.models import build_model
from fedsim.core.scenario_file import load_scenario
from fedsim.core.threat import ThreatModel
from fedsim.outputs.run_folder import AUDIT_FILE, VERDICT_FILE
from fedsim.scenario.portfolio import resolve_attacks
from fedsim.scenarios import scenario_path
from fedsim.text.scoring import lcs_length, rouge_l, rouge_n, score_sequences

TRANSFORMER = ModelConfig(name="word-transformer")


@functools.lru_cache(maxsize=1)
def _words() -> DatasetBundle:
    return load_dataset(DataConfig(dataset="shakespeare-words"))


def _probe(batch: int, seed: int, start: int = 0) -> Probe:
    """A seeded word-transformer and the probe gradient of ``batch`` real windows."""
    bundle = _words()
    spec = input_spec(bundle)
    model = build_model(TRANSFORMER, spec, seed=seed)
    order = torch.randperm(len(bundle.train_images), generator=torch.Generator().manual_seed(seed))
    chosen = order[start : start + batch]
    inputs, labels = bundle.train_images[chosen], bundle.train_labels[chosen]
    return gradient_probe(model, TRANSFORMER, spec, inputs, labels, bundle.normalization)


def _record(log: AuditLog, name: str, probe: Probe, params: dict | None = None) -> None:
    attack = resolve_attack(name, params)
    rec = attack.create().reconstruct(probe.observation, seed=0)
    log.reconstruction(
        attack, name, probe.observation, probe.truth, rec, TaskRun(0, DeviceUse("cpu", 0, 0), 0)
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dager_in_the_audit_recovers_a_probes_sentences_exactly(seed: int, tmp_path: Path) -> None:
    # 4 windows of 20 words: 80 tokens, under the limit of width 128 (126).
    probe = _probe(4, seed)
    log = AuditLog(tmp_path, Console(quiet=True), seed)

    _record(log, "dager", probe)
    log.write()

    audit = pd.read_csv(tmp_path / AUDIT_FILE)
    assert audit["exact-rate"].iloc[0] >= 0.95, audit.iloc[0]
    assert audit["rouge1"].iloc[0] >= 0.95 and audit["token-acc"].iloc[0] >= 0.95
    verdict = pd.read_csv(tmp_path / VERDICT_FILE)
    assert (
        verdict["sentences-exact"].iloc[0] >= 0.95
        and verdict["sentences-attack"].iloc[0] == "dager"
    )


def test_another_clients_gradient_gives_back_none_of_the_victims_sentences(tmp_path: Path) -> None:
    victim, other = _probe(4, seed=0), _probe(4, seed=0, start=100)
    # The server attacks the other client's gradient; the scorer holds the victim's batch.
    mixed = Probe(other.observation, victim.truth)
    log = AuditLog(tmp_path, Console(quiet=True), 0)

    _record(log, "dager", mixed)
    log.write()

    row = pd.read_csv(tmp_path / AUDIT_FILE).iloc[0]
    assert row["sequences-found"] == 4  # it read the other client's sentences...
    assert row["exact-rate"] == 0 and row["token-acc"] < 0.2, row  # ...not the victim's


def test_tag_is_scored_beside_dager_on_the_same_victim(tmp_path: Path) -> None:
    probe = _probe(1, seed=0)
    log = AuditLog(tmp_path, Console(quiet=True), 0)

    _record(log, "dager", probe)
    _record(log, "tag", probe, {"steps": 8})
    log.write()

    audit = pd.read_csv(tmp_path / AUDIT_FILE).set_index("attack")
    assert audit.loc["dager", "exact-rate"] == 1.0
    assert 0 <= audit.loc["tag", "token-acc"] <= 1 and audit.loc["tag", "steps-taken"] == 8
    assert audit.loc["tag", "final-objective"] > 0
    verdict = pd.read_csv(tmp_path / VERDICT_FILE).iloc[0]
    assert verdict["sentences-attack"] == "dager" and verdict["attacks"] == 2


def test_tag_lowers_its_gradient_distance() -> None:
    probe = _probe(1, seed=1)
    rec = resolve_attack("tag", {"steps": 6}).create().reconstruct(probe.observation, seed=0)
    assert rec.objective_trace[-1] < rec.objective_trace[0]
    assert rec.images.shape == (1, 20)


@pytest.mark.parametrize(
    ("scenario", "overrides", "fragment"),
    [
        # The shipped scenario's clients train with Adam on batches of 16 x 20 tokens.
        ("shakespeare", ['audit.attacks=[{name="dager"}]'], "client.optimizer = 'adam' rescales"),
        (
            "shakespeare",
            ['audit.attacks=[{name="dager"}]', "client.optimizer=sgd"],
            "a batch of 16 x 20 tokens (client.batch-size) reaches the rank limit",
        ),
        (
            "shakespeare",
            [
                'audit.attacks=[{name="tag"}]',
                "audit.threat-model=probe",
                "audit.probe-batch-size=7",
            ],
            "a batch of 7 x 20 tokens (audit.probe-batch-size) reaches the rank limit",
        ),
        ("shakespeare", ['audit.attacks=[{name="dager"}]', "model.name=char-lstm"], "no attention"),
        ("shakespeare", ['audit.attacks=[{name="tag"}]', "audit.threat-model=aggregate"], "reads"),
        ("quickstart", ['audit.attacks=[{name="dager"}]'], "is a text attack, and data.dataset"),
        (
            "shakespeare",
            [
                'audit.attacks=[{name="dager"}]',
                "strategy.name=fedsplit",
                "memorisation.enabled=false",
            ],
            "does not upload it",
        ),
    ],
)
def test_text_attacks_are_refused_in_one_line_where_they_cannot_apply(
    scenario: str, overrides: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = [arg for o in overrides for arg in ("--set", o)]
    assert main(["run", scenario, *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "audit.attacks[0]" in err, err
    assert fragment in err, err


def test_auto_runs_the_text_attacks_where_they_apply_and_says_why_not_elsewhere() -> None:
    scenario = load_scenario(scenario_path("shakespeare"))
    setting = AttackSetting.of(scenario, None)
    probed = dataclasses.replace(setting, threat_model=ThreatModel.PROBE, probe_batch_size=4)
    notes: list[str] = []

    on_probe = [a.name for a in resolve_attacks(scenario.audit, probed)]
    on_update = [a.name for a in resolve_attacks(scenario.audit, setting, notes)]

    assert on_probe == ["dager", "tag"]
    assert on_update == []  # Adam clients: the update is full-rank
    assert any("left out dager" in n and "'adam'" in n for n in notes), notes


def test_rouge_and_the_pairing_on_hand_computed_cases() -> None:
    assert lcs_length([1, 2, 3, 4], [1, 3, 4, 2]) == 3
    assert rouge_l([1, 2, 3, 4], [1, 3, 4, 2]) == 0.75
    assert rouge_n([1, 2, 3], [1, 2, 4], 2) == 0.5
    assert rouge_n([1, 1, 2], [1, 2, 2], 1) == pytest.approx(2 / 3)  # clipped counts
    truth = torch.tensor([[1, 2, 3, 4, 9], [5, 6, 7, 8, 9]])
    # One right sequence (in another order), one missing: half exact, the rest scored zero.
    score = score_sequences(torch.tensor([[5, 6, 7, 8]]), truth)
    assert (score.exact_rate, score.token_accuracy, score.found) == (0.5, 0.5, 1)
    assert score_sequences(torch.zeros(0, 4, dtype=torch.long), truth).rouge1 == 0


# The real Flower path (Ray actors, the audit's tasks, the run folder) with dager audited on
# each client's probe: about 60-90 s on 2 shared cores, most of it Ray's start-up.
@pytest.mark.slow
def test_a_real_text_federation_audited_by_dager_gives_back_every_probed_sentence(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    overrides = [
        "federation.rounds=1",
        "federation.num-clients=2",
        "federation.clients-per-round=2",
        "data.samples-per-client=32",
        "memorisation.enabled=false",
        "audit.threat-model=probe",
        "audit.probe-batch-size=4",
        'audit.attacks=[{name="dager"}]',
        "audit.leaks=[]",
    ]
    flags = [arg for o in overrides for arg in ("--set", o)]

    assert main(["run", "shakespeare", "--out", str(out), *flags]) == 0

    audit = pd.read_csv(out / AUDIT_FILE)
    assert len(audit) == 2 and (audit["exact-rate"] >= 0.95).all(), audit
    metrics = pd.read_csv(out / "metrics.csv")
    assert metrics["audit-sentences-exact"].iloc[-1] >= 0.95
    assert "Sentences, per round" in (out / "summary.md").read_text()
