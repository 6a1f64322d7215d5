"""fedsim's wire protocol and record formats: every key that crosses a boundary.

A strategy and its client routine agree on message keys; the engine and its
readers (``fedsim compare``, reports, tests) agree on CSV columns. Both sides
import the names from here instead of repeating string literals.

Messages follow Flower's layout: a ``RecordDict`` with an ``ArrayRecord``
under :data:`ARRAYS`, a ``ConfigRecord`` under :data:`CONFIG` (server to
client) and a ``MetricRecord`` under :data:`METRICS` (client to server).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

# -- records of a message ------------------------------------------------------
ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"

# -- what a node knows of itself (Flower's node config) -------------------------
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"

# -- config keys the server sends (public: the audit reads them) ----------------
SERVER_ROUND = "server-round"
PROXIMAL_MU = "proximal-mu"  # FedProx: the client adds (mu/2)||w - w_global||^2
FEDCG_GAMMA = "fedcg-gamma"  # FedCG stage 1: weight of the feature-matching term
FEDCG_DIVERSITY = "fedcg-diversity-weight"  # FedCG stage 2: diversity loss weight
FEDCG_GAN_STEPS = "fedcg-gan-steps"  # FedCG stage 2: minibatches (0 = as stage 1)
FEDCG_PROTOCOL = "fedcg-protocol"  # "fedsim" or "paper" (the FedCG code's GAN optimisers)
FAILURE = "fedsim.failure"  # a ConfigRecord marking an injected failure (engine.failures)
# Stragglers (federation.stragglers): the server sends a straggler ``straggler = 1`` and
# its smaller ``local-epochs`` (the client config's own key); every train reply echoes both.
STRAGGLER = "straggler"
LOCAL_EPOCHS = "local-epochs"

# -- metric keys a client replies with ------------------------------------------
NUM_EXAMPLES = "num-examples"  # the aggregation weight
TRAIN_LOSS = "train-loss"
EVAL_LOSS = "eval-loss"
EVAL_ACC = "eval-acc"
DP_EPSILON = "dp-epsilon"  # DP-SGD's epsilon spent so far
# Central DP's user-level epsilon spent so far (Flower's RDP accountant; [central-dp]).
CENTRAL_DP_EPSILON = "central-dp-epsilon"
# Andrew et al.'s user-level estimate from the audit's canary clients (audit.canary-clients):
# the model's change so far against their directions, with its 95 % bootstrap interval.
CENTRAL_DP_EPSILON_EMPIRICAL = "central-dp-epsilon-empirical"
CENTRAL_DP_EPSILON_EMPIRICAL_LOW = "central-dp-epsilon-empirical-low"
CENTRAL_DP_EPSILON_EMPIRICAL_HIGH = "central-dp-epsilon-empirical-high"
GAN_D_LOSS = "gan-d-loss"
GAN_G_LOSS = "gan-g-loss"
FEDCG_CE = "fedcg-ce-loss"  # FedCG stage 1: mean cross-entropy term
FEDCG_MSE = "fedcg-mse"  # FedCG stage 1: mean MSE(E(x), G_g(z, y)), before gamma
# The FedCG code's evaluation: the client's model right after local training (own
# extractor and own classifier), on its local validation and test splits.
LOCAL_VAL_ACC = "local-val-acc"
LOCAL_TEST_ACC = "local-test-acc"

# -- parameter-name prefixes: what a split model shares -------------------------
EXTRACTOR = "extractor."
CLASSIFIER = "classifier."
GENERATOR = "generator."
FEDSPLIT_SHARED = (CLASSIFIER,)  # FedSplit's messages: the classifier only
FEDCG_SHARED = (CLASSIFIER, GENERATOR)  # FedCG's: the classifier and the generator


def keep_prefixed(state: Mapping[str, T], prefixes: tuple[str, ...]) -> dict[str, T]:
    """The entries of ``state`` whose names start with one of ``prefixes``."""
    return {k: v for k, v in state.items() if k.startswith(prefixes)}


def drop_prefixed(state: Mapping[str, T], prefixes: tuple[str, ...]) -> dict[str, T]:
    """The entries of ``state`` whose names start with none of ``prefixes``."""
    return {k: v for k, v in state.items() if not k.startswith(prefixes)}


# -- metrics.csv: one row per round ---------------------------------------------
ROUND = "round"
TEST_ACC = "test-acc"  # the global model on the held-out test set
TEST_LOSS = "test-loss"
CLIENT_EVAL_ACC = "client-eval-acc"  # mean of the clients' local evaluation
CLIENT_EVAL_LOSS = "client-eval-loss"
CLIENTS_SAMPLED = "clients-sampled"
CLIENTS_TRAINED = "clients-trained"
FAILURES = "failures"
SECONDS = "seconds"
# Sync audits: this round's verdict (engine.audit.verdict), the median over victims
# of each victim's best attack, with its 95 % bootstrap interval; the share of
# victims whose verdict reached the success PSNR, with its Wilson interval; and
# 1 when an attack in the verdict did not converge (the verdict is a lower bound).
AUDIT_PSNR = "audit-psnr"
AUDIT_PSNR_LOW = "audit-psnr-low"
AUDIT_PSNR_HIGH = "audit-psnr-high"
AUDIT_SSIM = "audit-ssim"
AUDIT_LABEL_ACC = "audit-label-acc"
AUDIT_SUCCESS = "audit-success"
AUDIT_SUCCESS_LOW = "audit-success-low"
AUDIT_SUCCESS_HIGH = "audit-success-high"
AUDIT_VICTIMS = "audit-victims"
AUDIT_LOWER_BOUND = "audit-lower-bound"
# The verdict of each other kind of leak (leaks.csv), the median over the round's
# clients with its 95 % bootstrap interval: labels, the TV distance between the
# estimated and true class proportions (lower leaks more; its uniform guess's beside
# it); membership, the AUC and the TPR at 1 % FPR; class representatives, the SSIM
# to the class-mean image (in feature space, the cosine to the class-mean feature).
AUDIT_LABEL_TV = "audit-label-tv"
AUDIT_LABEL_TV_LOW = "audit-label-tv-low"
AUDIT_LABEL_TV_HIGH = "audit-label-tv-high"
AUDIT_LABEL_TV_UNIFORM = "audit-label-tv-uniform"
# The best data-free prior's TV (the lower of the uniform guess's and the public data's
# class mix's) and the median advantage over it of the best analysis (prior TV minus
# its TV; > 0: the update told the server more than the prior), with its interval.
AUDIT_LABEL_TV_PRIOR = "audit-label-tv-prior"
AUDIT_LABEL_ADVANTAGE = "audit-label-advantage"
AUDIT_LABEL_ADVANTAGE_LOW = "audit-label-advantage-low"
AUDIT_LABEL_ADVANTAGE_HIGH = "audit-label-advantage-high"
AUDIT_MEMBERSHIP_AUC = "audit-membership-auc"
AUDIT_MEMBERSHIP_AUC_LOW = "audit-membership-auc-low"
AUDIT_MEMBERSHIP_AUC_HIGH = "audit-membership-auc-high"
AUDIT_MEMBERSHIP_TPR = "audit-membership-tpr-1pct"
AUDIT_REPRESENTATIVES_SSIM = "audit-representatives-ssim"
AUDIT_REPRESENTATIVES_COSINE = "audit-representatives-cosine"
# Beside the representatives' SSIM, the public class-mean images' (the bar: what the
# server knows of the classes without the upload), median over the same clients.
AUDIT_REPRESENTATIVES_SSIM_PUBLIC = "audit-representatives-ssim-public"
AUDIT_LEAK_CLIENTS = "audit-leak-clients"
TEST_PERPLEXITY = "test-perplexity"  # a text model's: exp(test-loss), per predicted token
# [memorisation]: the wall seconds of measuring every canary's exposure on the global model.
MEMORISATION_SECONDS = "memorisation-seconds"
# words: F1 of the tokens read from the embedding update (median over clients, 95 %
# interval) and of the frequency prior's guess of as many tokens.
AUDIT_WORDS_F1 = "audit-words-f1"
AUDIT_WORDS_F1_LOW = "audit-words-f1-low"
AUDIT_WORDS_F1_HIGH = "audit-words-f1-high"
AUDIT_WORDS_PRIOR_F1 = "audit-words-prior-f1"
AUDIT_SENTENCES_EXACT = "audit-sentences-exact"
AUDIT_SENTENCES_EXACT_LOW = "audit-sentences-exact-low"
AUDIT_SENTENCES_EXACT_HIGH = "audit-sentences-exact-high"
AUDIT_SENTENCES_ROUGE1 = "audit-sentences-rouge1"
# The one-run audit's lower bound on epsilon from the canary client's canaries (the
# highest over the membership analyses, each at 1 - 5 % / their number: 95 % jointly).
AUDIT_EPSILON_EMPIRICAL = "audit-epsilon-empirical"
# Beside it, the f-DP one-run bound (Mahloujifar et al.) on the same scores: the epsilon
# of the largest mu-GDP claim rejected, at dp-sgd's delta (else 1e-5), 95 % jointly.
AUDIT_EPSILON_EMPIRICAL_FDP = "audit-epsilon-empirical-fdp"
# The counterfactual probe's reconstruction (audit.probe-rounds): its median PSNR over
# the round's victims with its interval, kept apart from the verdict on what was received.
AUDIT_COUNTERFACTUAL_PSNR = "audit-counterfactual-psnr"
AUDIT_COUNTERFACTUAL_PSNR_LOW = "audit-counterfactual-psnr-low"
AUDIT_COUNTERFACTUAL_PSNR_HIGH = "audit-counterfactual-psnr-high"
AUDIT_LEAK_COLUMNS = (
    *(AUDIT_LABEL_TV, AUDIT_LABEL_TV_LOW, AUDIT_LABEL_TV_HIGH, AUDIT_LABEL_TV_UNIFORM),
    *(AUDIT_MEMBERSHIP_AUC, AUDIT_MEMBERSHIP_AUC_LOW, AUDIT_MEMBERSHIP_AUC_HIGH),
    *(AUDIT_MEMBERSHIP_TPR, AUDIT_REPRESENTATIVES_SSIM, AUDIT_REPRESENTATIVES_COSINE),
    AUDIT_REPRESENTATIVES_SSIM_PUBLIC,
    *(AUDIT_LEAK_CLIENTS, AUDIT_EPSILON_EMPIRICAL, AUDIT_EPSILON_EMPIRICAL_FDP),
    *(AUDIT_WORDS_F1, AUDIT_WORDS_F1_LOW, AUDIT_WORDS_F1_HIGH, AUDIT_WORDS_PRIOR_F1),
    *(AUDIT_COUNTERFACTUAL_PSNR, AUDIT_COUNTERFACTUAL_PSNR_LOW, AUDIT_COUNTERFACTUAL_PSNR_HIGH),
)
AUDIT_COLUMNS = (
    *(AUDIT_PSNR, AUDIT_PSNR_LOW, AUDIT_PSNR_HIGH, AUDIT_SSIM, AUDIT_LABEL_ACC),
    *(AUDIT_SUCCESS, AUDIT_SUCCESS_LOW, AUDIT_SUCCESS_HIGH, AUDIT_VICTIMS, AUDIT_LOWER_BOUND),
    *(AUDIT_SENTENCES_EXACT, AUDIT_SENTENCES_EXACT_LOW, AUDIT_SENTENCES_EXACT_HIGH),
    AUDIT_SENTENCES_ROUGE1,
    *AUDIT_LEAK_COLUMNS,
)
# FedCG's server distillation: teacher-student KL on held-out codes before it,
# of the distilled pair, and of the pair kept (the distilled one only when it
# lowered the KL: ``distill-accepted`` 1, else 0), and its wall seconds.
DISTILL_KL_BEFORE = "distill-kl-before"
DISTILL_KL_DISTILLED = "distill-kl-distilled"
DISTILL_KL_AFTER = "distill-kl-after"
DISTILL_ACCEPTED = "distill-accepted"
DISTILL_SECONDS = "distill-seconds"
# Stragglers' replies a strategy left out of the round's aggregate (FedAvg drops them).
STRAGGLERS_DROPPED = "stragglers-dropped"

# -- clients.csv: one row per client, phase and round -----------------------------
PHASE = "phase"
FAILURE_KIND = "failure"  # "error" or "timeout" for a client that did not reply
# Facts about one client's reply, recorded per client and never averaged over clients.
PER_CLIENT_METRICS = (PARTITION_ID, STRAGGLER, LOCAL_EPOCHS)


def read_int(record: Mapping[str, Any], key: str) -> int:
    """``record[key]`` (a Flower config or metric record) as an ``int``."""
    return int(record[key])


def read_float(record: Mapping[str, Any], key: str) -> float:
    """``record[key]`` (a Flower config or metric record) as a ``float``."""
    return float(record[key])


def kebab(name: str) -> str:
    """A Python field name as a file key: ``label_acc`` -> ``label-acc``."""
    return name.replace("_", "-")


# -- what one round produced (the round loop's callbacks receive it) --------------
@dataclass
class RoundRecord:
    """Everything one round produced, for the round loop's callbacks.

    ``failed`` maps each sampled client that did not deliver a training reply
    (by partition id) to ``"error"`` (it raised) or ``"timeout"`` (no reply by
    the deadline).
    """

    round: int
    seconds: float
    sampled: int
    replies: int
    failures: int
    train: dict[str, float] = field(default_factory=dict)
    evaluate: dict[str, float] = field(default_factory=dict)
    server: dict[str, float] = field(default_factory=dict)
    clients: list[dict[str, Any]] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class AuditRecord:
    """One row of ``audit.csv``: one attack on one victim in one round.

    Column names are the field names in kebab-case (:meth:`column`).
    """

    round: int
    client: int
    strategy: str
    attack: str
    threat_model: str
    shared_kind: str
    parameters_observed: int
    tensors_observed: int
    batch_size: int
    psnr: float
    ssim: float
    mse: float
    label_acc: float
    # Images at PSNR >= 20 dB and SSIM >= 0.8 (core.metrics.ReconstructionScore.recovered);
    # NaN unscored. Of an aggregate's, however many of its clients' images they are.
    images_recovered: float
    iterations: int  # the step budget
    steps_taken: int  # steps run (fewer when the attack stopped early)
    converged: bool  # the kept restart met the convergence rule (attacks.toolkits.convergence)
    restarts: int
    diverged_restarts: int  # restarts excluded: objective non-finite or above its start
    final_objective: float
    seconds: float
    wall_seconds: float
    attack_params: str
    # How the attack's model normalised BatchNorm layers (gradients.batchnorm_view).
    batchnorm: str
    # ||simulated - intercepted|| / ||intercepted|| on the true batch (engine.audit.fidelity).
    fidelity_residual: float
    fidelity_note: str  # why the residual is large ("" when the attack's model is exact)
    # The same residual on the attack's own reconstruction: what the attacker can
    # compute without the truth, and how it picks among attacks (the verdict's pick).
    attacker_residual: float
    device: str = "cpu"  # where the attack ran ("cpu" or the GPU's name)
    gpu_seconds: float = 0.0  # its share of the task's time holding a GPU
    peak_gpu_mb: float = 0.0  # the task's peak GPU memory (MiB)
    # Why the kept restart stopped (attacks.toolkits.convergence): converged, stalled-at-failure,
    # still-improving, diverged; "" for an attack that does not say (a closed form).
    stop_reason: str = ""
    # A probe attacked in an update audit (audit.probe-rounds): what one batch's gradient
    # would give, which the server never receives. Kept out of the round's verdict.
    counterfactual: bool = False
    # A text attack's scores (fedsim.text.scoring; NaN for images): true sequences
    # recovered token for token, tokens right at their position, ROUGE-1/2/L F1, and the
    # sequences it returned. The paired sequences as token ids ("|" between sequences,
    # ";" between tokens), the recovered one of each pair under its truth.
    exact_rate: float = math.nan
    token_acc: float = math.nan
    rouge1: float = math.nan
    rouge2: float = math.nan
    rouge_l: float = math.nan
    sequences_found: float = math.nan
    text_recovered: str = ""
    text_truth: str = ""

    def to_row(self) -> dict[str, Any]:
        """The CSV row, kebab-case keys in field order."""
        return {kebab(f.name): getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def column(cls, field_name: str) -> str:
        """The CSV column of ``field_name`` (a typo raises instead of reading nothing)."""
        names = {f.name for f in dataclasses.fields(cls)}
        if field_name not in names:
            raise KeyError(f"audit.csv has no column for {field_name!r}")
        return kebab(field_name)


@dataclass(frozen=True)
class VerdictRecord:
    """One row of ``verdict.csv``: the worst case over a victim's attacks in one round.

    ``psnr``/``ssim``/``label_acc`` are the best any attack reached (the
    auditor's reading, chosen with the truth in the scorer), each with the
    attack that reached it. ``pick_*`` is the attacker's own reading: the
    attack whose reconstruction best reproduces the intercepted gradient
    (lowest ``attacker-residual``), chosen without the truth. ``bound`` is
    ``converged`` when every attack converged, else ``lower bound``.
    """

    round: int
    client: int
    batch_size: int
    attacks: int
    attacks_converged: int
    bound: str
    psnr: float
    psnr_attack: str
    ssim: float
    ssim_attack: str
    label_acc: float
    label_acc_attack: str
    pick_attack: str
    pick_psnr: float
    pick_ssim: float
    pick_residual: float
    # The other kinds of leak (leaks.csv), each the strongest analysis on this client:
    # the lowest label TV distance, the highest membership AUC (with its interval and
    # TPR at 1 % FPR), the highest representatives' SSIM (or feature cosine).
    label_tv: float = float("nan")
    label_tv_uniform: float = float("nan")
    label_analysis: str = ""  # "prior" where no analysis beat the best data-free prior
    label_tv_prior: float = float("nan")  # the lower of the uniform and public-mix TVs
    label_advantage: float = float("nan")  # label_tv_prior minus the best analysis's TV
    membership_auc: float = float("nan")
    membership_auc_low: float = float("nan")
    membership_auc_high: float = float("nan")
    membership_tpr_1pct: float = float("nan")
    membership_analysis: str = ""
    epsilon_empirical: float = float("nan")  # the canary client's: the highest over analyses
    epsilon_empirical_fdp: float = float("nan")  # the same, f-DP (Mahloujifar et al.)
    representatives_ssim: float = float("nan")
    representatives_ssim_public: float = float("nan")  # its public class means' SSIM
    representatives_cosine: float = float("nan")
    representatives_analysis: str = ""
    words_f1: float = float("nan")  # the best words analysis's F1, beside its frequency prior's
    words_prior_f1: float = float("nan")
    words_analysis: str = ""
    # The counterfactual probe's reconstruction (audit.probe-rounds), never in the above:
    # its best PSNR and SSIM and the attack that reached the PSNR.
    counterfactual_psnr: float = float("nan")
    counterfactual_ssim: float = float("nan")
    counterfactual_attack: str = ""
    # Text reconstruction ("sentences"): the best exact-sequence rate, token accuracy and
    # ROUGE-1 over the victim's text attacks, and the attack that reached the exact rate.
    sentences_exact: float = float("nan")
    sentences_token_acc: float = float("nan")
    sentences_rouge1: float = float("nan")
    sentences_attack: str = ""

    def to_row(self) -> dict[str, Any]:
        """The CSV row, kebab-case keys in field order."""
        return {kebab(f.name): getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class LeakRecord:
    """One row of ``leaks.csv``: one leak analysis on one client in one round.

    ``kind`` says which columns hold its scores (the others are empty):
    ``labels`` the ``label-*``, ``membership`` the ``membership-*`` (each with its
    95 % bootstrap interval over the candidates), ``representatives`` the
    ``representatives-*``, ``words`` the ``words-*`` (token ids ";"-separated).
    ``examples``: what the update was computed on.
    """

    round: int
    client: int
    strategy: str
    kind: str
    analysis: str
    threat_model: str
    shared_kind: str
    examples: int
    label_tv: float = math.nan
    label_tv_uniform: float = math.nan
    label_tv_public: float = math.nan  # the public data's class mix as the guess
    label_attributed: float = math.nan
    label_top_right: float = math.nan
    label_estimate: str = ""  # estimated examples per class, rounded, ";"-separated
    label_truth: str = ""  # true examples per class
    candidates: int = 0
    membership_auc: float = math.nan
    membership_auc_low: float = math.nan
    membership_auc_high: float = math.nan
    membership_tpr_1pct: float = math.nan
    membership_tpr_1pct_low: float = math.nan
    membership_tpr_1pct_high: float = math.nan
    membership_tpr_01pct: float = math.nan
    membership_tpr_01pct_low: float = math.nan
    membership_tpr_01pct_high: float = math.nan
    # The one-run audit (audit.canaries): the candidates were the canaries, and this the
    # lower bound on epsilon their scores gave (Steinke et al.; NaN on other clients),
    # and beside it the f-DP bound (Mahloujifar et al.): the largest mu-GDP claim the
    # scores reject and its epsilon at the claim's delta (1e-5 where the run has none).
    epsilon_empirical: float = math.nan
    mu_empirical_fdp: float = math.nan
    epsilon_empirical_fdp: float = math.nan
    representatives: int = 0
    representatives_space: str = ""  # "pixels" (inverted to images) or "features"
    representatives_classes: str = ""  # the classes read, ";"-separated
    representatives_psnr: float = math.nan  # to the class-mean image
    representatives_ssim: float = math.nan
    representatives_psnr_nearest: float = math.nan  # to the nearest image of its class
    representatives_ssim_nearest: float = math.nan
    representatives_cosine: float = math.nan  # to the class-mean feature vector
    # The public bar: the server's public class-mean images of the same classes, scored
    # to the same class-mean images (what the server knows without the upload).
    representatives_psnr_public: float = math.nan
    representatives_ssim_public: float = math.nan
    words_found: int = 0  # tokens the analysis read from the update
    words_true: int = 0  # tokens the client fed its model this round
    words_precision: float = math.nan
    words_recall: float = math.nan
    words_f1: float = math.nan
    words_prior_f1: float = math.nan  # the frequency prior's guess of words-found tokens
    words_estimate: str = ""
    words_truth: str = ""
    converged: bool = True
    seconds: float = 0.0
    analysis_params: str = ""

    def to_row(self) -> dict[str, Any]:
        """The CSV row, kebab-case keys in field order."""
        return {kebab(f.name): getattr(self, f.name) for f in dataclasses.fields(self)}


CONVERGED = "converged"
LOWER_BOUND = "lower bound"
