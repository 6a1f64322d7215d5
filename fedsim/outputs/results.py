"""The run directory: resolved scenario, per-round metrics, final model, summary.

Rows are written as each round ends (the CSV is rewritten atomically), so an
interrupted run keeps every finished round; ``checkpoint/`` holds what a
resumed run needs (:mod:`fedsim.simulation.checkpoint`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from flwr.app import ArrayRecord
from rich.console import Console

from fedsim.core import protocol
from fedsim.core.config import CentralDPConfig, DataConfig, Scenario
from fedsim.core.metrics import median_interval
from fedsim.core.protocol import RoundRecord
from fedsim.outputs.run_folder import (
    CLIENTS_FILE,
    DEPARTURES,
    METRICS_FILE,
    RUN_INFO_FILE,
    SUMMARY_FILE,
    WALL_SECONDS,
    read_audit,
    write_csv_atomic,
)
from fedsim.outputs.sentences_report import sentences_summary_lines, text_rows
from fedsim.outputs.tables import (
    DEFAULT_SUCCESS_PSNR,
    attack_summary_table,
    audit_seed,
    duration,
    leak_verdict_table,
    round_verdict_table,
)
from fedsim.outputs.verdict import strongest_attacks, victim_verdicts
from fedsim.outputs.words_report import words_summary_lines


def _split_of(data: DataConfig) -> str:
    """How the clients' data arises: the partitioner, or a generated dataset's parameters."""
    from fedsim.core.data import generated_dataset

    if generated_dataset(data) is None:
        return data.partitioner.name
    given = ", ".join(f"{k} = {v}" for k, v in data.generator.params.items())
    return f"generated per client{': ' + given if given else ''}"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4f}"
    return str(value)


@dataclass
class RunRecorder:
    """Round callback writing ``metrics.csv`` / ``clients.csv`` and printing progress.

    ``clients.csv`` has a row per client and phase; a client that failed has
    its ``failure`` (``error`` or ``timeout``) and no metrics.
    """

    run_dir: Path
    total_rounds: int
    console: Console = field(default_factory=lambda: Console(soft_wrap=True))
    rows: list[dict[str, Any]] = field(default_factory=list)
    client_rows: list[dict[str, Any]] = field(default_factory=list)
    # Wall time of this session, plus that of earlier sessions of a resumed run.
    started: float = field(default_factory=time.monotonic)
    earlier_seconds: float = 0.0
    _first_round_ended: float | None = field(default=None, init=False, repr=False)
    _session_intervals: int = field(default=0, init=False, repr=False)
    checkpoint_key: ClassVar[str] = "recorder"

    @property
    def wall_seconds(self) -> float:
        """Seconds the run has taken so far (start-up, rounds, audit), over all sessions."""
        return self.earlier_seconds + time.monotonic() - self.started

    def _eta_seconds(self, record: RoundRecord) -> float:
        """Time left after ``record``'s round: the mean wall time between this
        session's round ends (a round's own seconds leave out the sync audit), so
        known from the session's second round on."""
        now = time.monotonic()
        if self._first_round_ended is None:
            self._first_round_ended = now
            return math.nan
        self._session_intervals += 1
        per_round = (now - self._first_round_ended) / self._session_intervals
        return per_round * (self.total_rounds - record.round)

    def on_round_end(self, record: RoundRecord, arrays: ArrayRecord) -> None:
        row: dict[str, Any] = {
            protocol.ROUND: record.round,
            protocol.TRAIN_LOSS: record.train.get(protocol.TRAIN_LOSS, math.nan),
            protocol.TEST_ACC: record.server.get(protocol.TEST_ACC, math.nan),
            protocol.TEST_LOSS: record.server.get(protocol.TEST_LOSS, math.nan),
            protocol.CLIENT_EVAL_ACC: record.evaluate.get(protocol.EVAL_ACC, math.nan),
            protocol.CLIENT_EVAL_LOSS: record.evaluate.get(protocol.EVAL_LOSS, math.nan),
            protocol.CLIENTS_SAMPLED: record.sampled,
            protocol.CLIENTS_TRAINED: record.replies,
            protocol.FAILURES: record.failures,
            protocol.SECONDS: record.seconds,
        }
        # Strategy-specific metrics get their own columns (client ones prefixed).
        extra = {**record.train, **{f"client-{k}": v for k, v in record.evaluate.items()}}
        for key, value in {**extra, **record.server}.items():
            row.setdefault(key, value)
        self.rows.append(row)
        self.client_rows.extend(record.clients)
        self._write()
        shown = (protocol.TRAIN_LOSS, protocol.TEST_ACC, protocol.CLIENT_EVAL_ACC)
        # A metric a strategy does not have (test-acc without a global model) is left out.
        parts = "  ".join(
            f"{k} {_fmt(row[k])}"
            for k in shown
            if not (isinstance(row[k], float) and math.isnan(row[k]))
        )
        failed = ", ".join(f"#{client} {kind}" for client, kind in record.failed.items())
        eta = self._eta_seconds(record)
        self.console.print(
            f"[bold]round {record.round}/{self.total_rounds}[/bold]  {parts}  "
            f"clients {record.replies}/{record.sampled}  {record.seconds:.1f}s"
            + (f"  ETA {duration(eta)}" if math.isfinite(eta) and eta > 0 else "")
            + (f"  failed: {failed}" if failed else "")
        )

    def _write(self) -> None:
        write_csv_atomic(self.rows, self.run_dir / METRICS_FILE)
        write_csv_atomic(self.client_rows, self.run_dir / CLIENTS_FILE)

    def state_dict(self) -> dict[str, Any]:
        """The rows so far (the checkpoint keeps them, see :mod:`fedsim.simulation.checkpoint`)."""
        return {
            "rows": self.rows,
            "client_rows": self.client_rows,
            "wall_seconds": self.wall_seconds,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from checkpointed rows; the CSVs drop rows of unfinished rounds."""
        self.rows, self.client_rows = list(state["rows"]), list(state["client_rows"])
        self.earlier_seconds = float(state.get("wall_seconds", 0.0))
        self._write()


def accuracy_line(last: dict[str, Any], best: float) -> str:
    """Final accuracies; strategies without a global model report only their clients'."""
    client = f"final client-eval accuracy: {_fmt(last.get('client-eval-acc', math.nan))}"
    test = last.get(protocol.TEST_ACC, math.nan)
    if math.isnan(test):
        return f"- no global model to test (personalised evaluation); {client}"
    return f"- final test accuracy: {_fmt(test)} (best {_fmt(best)}); {client}"


def write_summary(
    scenario: Scenario,
    rows: list[dict[str, Any]],
    run_dir: Path,
    wall_seconds: float,
    departures: Sequence[str] = (),
    audit_notes: Sequence[str] = (),
) -> str:
    """A short markdown summary of the run (also returned for printing).

    ``wall_seconds``: the run's true wall time (start-up, rounds, audit; every
    session of a resumed run); the rounds' own seconds are given beside it.
    ``departures``: where the strategy's settings depart from what its authors
    ran (``EngineHooks.departures``, e.g. FedCG's compressed gamma ramp), one
    line each in the summary and kept in ``run.json`` for the report. ``audit_notes``:
    what the audit's ``"auto"`` left out and why, and degenerate audit settings
    (:func:`fedsim.scenario.applicability.audit_notes`), one line each.
    """
    last = rows[-1] if rows else {}
    best = max((r.get(protocol.TEST_ACC, math.nan) for r in rows), default=math.nan)
    in_rounds = sum(r.get(protocol.SECONDS, 0.0) for r in rows)
    lines = [
        f"# {scenario.name}",
        "",
        scenario.description or "",
        "",
        f"- strategy: {scenario.strategy.name}; model: {scenario.model.name} "
        f"({scenario.model.init}); dataset: {scenario.data.dataset} ({_split_of(scenario.data)})",
        f"- clients: {scenario.federation.num_clients}, "
        f"{scenario.federation.sampled_per_round} per round; rounds: {len(rows)}",
        accuracy_line(last, best),
        f"- wall time: {duration(wall_seconds)} ({wall_seconds:.1f}s; training and evaluation "
        f"in rounds {in_rounds:.1f}s, the rest is start-up and the audit)",
    ]
    lines += [f"- departs from the authors' settings: {line}" for line in departures]
    failures = [r for r in rows if r.get(protocol.FAILURES, 0)]
    if failures:
        count = sum(int(r[protocol.FAILURES]) for r in failures)
        lines.append(f"- client failures: {count} in {len(failures)} of {len(rows)} rounds")
    lines += central_dp_lines(scenario.central_dp, scenario.audit.canary_clients, rows)
    lines += epsilon_lines(rows)
    lines += audit_summary_lines(run_dir)
    lines += [f"- audit: {line}" for line in audit_notes]
    text = "\n".join(lines) + "\n"
    (run_dir / SUMMARY_FILE).write_text(text)
    info = {WALL_SECONDS: wall_seconds, DEPARTURES: list(departures)}
    (run_dir / RUN_INFO_FILE).write_text(json.dumps(info) + "\n")
    return text


def central_dp_lines(
    central: CentralDPConfig, canary_clients: int, rows: list[dict[str, Any]]
) -> list[str]:
    """Flower's central DP: its settings and the accountant's user-level epsilon spent (and
    the ``canary_clients``' estimate, where there were any)."""
    if not central.enabled:
        return []
    spent = [e for r in rows if math.isfinite(e := r.get(protocol.CENTRAL_DP_EPSILON, math.nan))]
    released = f"{spent[-1]:.3g} after {len(spent)} noised rounds" if spent else "none released"
    lines = [
        f"- central DP (Flower's {central.clipping}-side fixed clipping, noise multiplier "
        f"{central.noise_multiplier:g}, clipping norm {central.clipping_norm:g}): user-level "
        f"epsilon {released} at delta {central.delta:g} (Flower's RDP accountant, no "
        "amplification by sampling); the server adds the noise after aggregating, so it "
        "protects the released model, not the server's view"
    ]
    estimated = [r for r in rows if protocol.CENTRAL_DP_EPSILON_EMPIRICAL in r]
    if estimated:
        last = estimated[-1]
        lines.append(
            f"- empirical user-level epsilon (Andrew et al.'s canary clients, "
            f"{canary_clients} in every round): "
            f"{last[protocol.CENTRAL_DP_EPSILON_EMPIRICAL]:.3g} "
            f"[{last[protocol.CENTRAL_DP_EPSILON_EMPIRICAL_LOW]:.3g}, "
            f"{last[protocol.CENTRAL_DP_EPSILON_EMPIRICAL_HIGH]:.3g}] (95 % bootstrap) after "
            f"round {last[protocol.ROUND]}: an estimate, not a bound, beside the accountant's "
            "upper bound; the canaries are part of the released model"
        )
    return lines


def epsilon_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The one-run audit's empirical epsilon (its highest round; Steinke et al.'s, then the
    f-DP bound's on the same scores) beside the accountant's."""
    audited = [r for r in rows if not math.isnan(r.get(protocol.AUDIT_EPSILON_EMPIRICAL, math.nan))]
    if not audited:
        return []
    top = max(audited, key=lambda r: r[protocol.AUDIT_EPSILON_EMPIRICAL])
    accountant = top.get(protocol.DP_EPSILON, math.nan)
    beside = (
        "" if math.isnan(accountant) else f"; the accountant's dp-epsilon then {accountant:.3g}"
    )
    fdp = [
        e
        for r in audited
        if math.isfinite(e := r.get(protocol.AUDIT_EPSILON_EMPIRICAL_FDP, math.nan))
    ]
    fdp_text = f"; f-DP (mu-GDP) on the same scores: highest {max(fdp):.3g}" if fdp else ""
    return [
        f"- empirical epsilon (canaries, one-run audit, 95 % per round): highest "
        f"{top[protocol.AUDIT_EPSILON_EMPIRICAL]:.3g} in round {top[protocol.ROUND]} of "
        f"{len(audited)} audited{fdp_text}{beside}"
    ]


def audit_summary_lines(run_dir: Path, threshold: float = DEFAULT_SUCCESS_PSNR) -> list[str]:
    """The audit in markdown: each kind of leak's verdict per round, then one row per
    attack (nothing if not audited)."""
    audit, leaks = read_audit(run_dir)
    if audit.empty and leaks.empty:
        return []
    seed = audit_seed(run_dir)
    verdicts = victim_verdicts(audit, leaks)
    lines = ["", "## Privacy audit", ""]
    if not leaks.empty:
        lines += [
            "What the server learned from each client's update, per round: the median over "
            "the round's clients of each client's strongest analysis, with a 95 % bootstrap "
            "interval. Labels: total-variation distance between the estimated and the true "
            "class proportions of what the client trained on (0 = exact; the uniform guess's "
            "beside it). Membership: ROC AUC over candidates it trained on and held-out "
            "non-members of its class mix (0.5 = chance), and the TPR at 1 % FPR. Class "
            "representatives: SSIM to the class-mean image (the server's public class-mean "
            "images' beside it: what it knows without the update). Words (text): F1 of the "
            "tokens read "
            "from the embedding update against those the client used (a frequency prior's "
            "beside it). Per client: `verdict.csv`, per analysis: `leaks.csv`.",
            "",
            leak_verdict_table(verdicts, seed).table.markdown(),
            "",
            *words_summary_lines(run_dir, leaks),
        ]
    if audit.empty:
        return lines
    text = text_rows(audit)
    lines += sentences_summary_lines(run_dir, text, verdicts, seed)
    audit = audit.drop(index=text.index)  # the rest: image attacks, scored in pixels
    if audit.empty:
        return lines
    attacked = verdicts[verdicts["attacks"] > 0]
    if "sentences-exact" in attacked:
        attacked = attacked[attacked["sentences-exact"].isna()]
    verdict = round_verdict_table(attacked, seed, threshold)
    lower = any(r["bound"] == protocol.LOWER_BOUND for r in verdict.table.rows)
    if not attacked.empty:
        lines += [
            "Reconstruction, per round: for each victim the best PSNR any attack reached, "
            "then the median over the round's victims with a 95 % bootstrap interval, and the "
            f"share of victims at or above {threshold:g} dB with a Wilson interval. PSNR in dB "
            "(peak 1 on [0, 1] pixels).",
            "",
            verdict.table.markdown(),
            "",
        ]
    probed = verdicts[verdicts["counterfactual-psnr"].notna()]
    for server_round, rows in probed.groupby("round"):
        median = median_interval(rows["counterfactual-psnr"].to_numpy(dtype=float), seed)
        lines += [
            f"Round {server_round}, the *probe* as a counterfactual (one image's gradient at the "
            "sent model, which the server never receives; attacks named `-probe`): median "
            f"PSNR {median.value:.2f} dB over {len(rows)} victims (95 % interval "
            f"{median.low:.1f} to {median.high:.1f}), strongest "
            f"{strongest_attacks(rows['counterfactual-attack'])}.",
            "",
        ]
    if lower:
        lines += [
            "A *lower bound*: an attack in that round did not converge (`converged` in "
            "`audit.csv`); more steps could recover more.",
            "",
        ]
    lines += [
        "Single attacks (all rounds and victims):",
        "",
        attack_summary_table(audit, threshold).markdown(),
    ]
    return lines
