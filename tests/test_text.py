"""Text federations on real Shakespeare: data, models, the modality seam and the words leak.

Fast: the real client routine trains in-process on real speaking roles; the one
Flower simulation of the shipped scenario is marked slow.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from client_updates import observed_update
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedsim.attacks.base import PublicData
from fedsim.attacks.leakage import LeakInput, WordsLeak
from fedsim.attacks.leaks.words import EmbeddingWords, WordsParams
from fedsim.cli import main
from fedsim.clients import CLIENT_ROUTINES
from fedsim.clients.base import ClientEnv, ClientSpec
from fedsim.core import protocol
from fedsim.core.config import (
    BackendConfig,
    ClientConfig,
    ComponentConfig,
    DataConfig,
    FederationConfig,
    ModelConfig,
    ScenarioError,
)
from fedsim.core.data import DATASETS, load_dataset, load_raw
from fedsim.core.memorisation import MemorisationConfig
from fedsim.core.modality import TEXT, input_spec, modality_of
from fedsim.core.models import MODELS, build_model
from fedsim.core.training import client_config_record, evaluate
from fedsim.scenario.machine import check_data_fits, held_bytes
from fedsim.text.canaries import PlantedCanaries
from fedsim.text.models import OUTPUT_WEIGHT, TOKEN_EMBEDDING
from fedsim.text.shakespeare import roles
from fedsim.text.tokens import CANARY_TOKENS, OOV
from fedsim.text.words import input_tokens, score_tokens

WORDS = DataConfig(
    dataset="shakespeare-words",
    partitioner=ComponentConfig("groups", {"order": "largest"}),
    samples_per_client=64,
    test_fraction=0.1,
)
TRANSFORMER = ModelConfig(name="word-transformer")


def test_shakespeare_is_split_by_speaking_role_as_leaf_splits_it() -> None:
    found = roles()
    plays = {role.play for role in found}
    # LEAF's full set: 1,129 roles; the modern texts here give about as many.
    assert len(plays) == 37
    assert 1000 <= len(found) <= 1150
    hamlet = next(r for r in found if r.play == "hamlet" and r.speaker == "Ham")
    assert hamlet.lines[0].startswith("A little more than kin")
    assert len(hamlet.lines) > 1000


def test_word_windows_keep_the_canary_tokens_in_vocabulary() -> None:
    bundle = load_dataset(DataConfig(dataset="shakespeare-words"))
    assert bundle.modality == TEXT and bundle.num_classes == 2000
    assert bundle.vocabulary[0] == OOV
    assert set(CANARY_TOKENS) <= set(bundle.vocabulary)
    assert bundle.train_images.shape[1] == 21 and bundle.train_images.dtype == torch.int64
    # Out-of-vocabulary words are few with 2,000 words: under 15 % of tokens.
    assert float((bundle.train_images == 0).float().mean()) < 0.15
    assert len(bundle.test_labels) * 15 < len(bundle.train_labels) < len(bundle.test_labels) * 25


@pytest.mark.parametrize("name", ["char-lstm", "word-transformer"])
def test_text_models_map_token_ids_to_next_token_logits(name: str) -> None:
    bundle = load_dataset(DataConfig(dataset="shakespeare"))
    model = build_model(ModelConfig(name=name), input_spec(bundle), seed=0)
    logits = model(bundle.train_images[:3, :-1])
    assert logits.shape == (3, 80, 80)
    assert {TOKEN_EMBEDDING, OUTPUT_WEIGHT} <= set(model.state_dict())
    assert modality_of(MODELS.get(name)) == TEXT
    loss, accuracy = evaluate(model, bundle.test_images[:50], bundle.test_labels[:50])
    assert abs(loss - math.log(80)) < 0.5 and 0 <= accuracy < 0.2  # untrained: near uniform


@pytest.mark.parametrize(
    ("scenario", "override", "key", "fragment"),
    [
        # Image components with text data.
        ("shakespeare", "model.name=lenet-zhu", "model.name", "is an image model, and data"),
        ("shakespeare", "strategy.name=fedcg", "strategy.name", "is an image strategy"),
        ("shakespeare", 'audit.attacks=[{name="dlg"}]', "audit.attacks[0]", "an image attack"),
        (
            "shakespeare",
            'audit.leaks=[{name="llg"}]',
            "audit.leaks[0]",
            "text data: gradient-alignment, loss-drop, words",
        ),
        ("shakespeare", "data.dataset=mnist-embedded", "model.name", "is a text model"),
        # Text components with image data.
        ("quickstart", "model.name=char-lstm", "model.name", "allowed with image data: cnn"),
        ("quickstart", 'audit.leaks=[{name="words"}]', "audit.leaks[0]", "a text leak analysis"),
        (
            "quickstart",
            "memorisation.enabled=true",
            "memorisation.enabled",
            "text datasets: flwr-local-text, ",
        ),
        ("shakespeare", "strategy.name=fedsplit", "memorisation.enabled", "global model (fedavg"),
    ],
)
def test_components_of_another_modality_are_refused_in_one_line_both_ways(
    scenario: str, override: str, key: str, fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", scenario, "--set", override]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"fedsim: error: {key} = "), err
    assert fragment in err, err


def test_fedsim_attack_refuses_text_data_and_text_models(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for flags, fragment in (
        (["--dataset", "shakespeare"], "--dataset = 'shakespeare': is text, not images"),
        (["--model", "char-lstm"], "--model = 'char-lstm': is a text model"),
    ):
        assert main(["attack", "--attack", "dlg", *flags]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and fragment in err, err


def test_the_groups_partitioner_gives_each_client_one_speaking_role() -> None:
    bundle = load_dataset(WORDS)
    spec = ClientSpec(TRANSFORMER, WORDS, num_clients=6, seed=0)
    envs = [ClientEnv.create(spec, c, RecordDict()) for c in range(6)]
    groups = [set(bundle.train_labels[torch.from_numpy(e.split.train)].tolist()) for e in envs]
    assert all(len(g) == 1 for g in groups) and len(set().union(*groups)) == 6
    assert all(len(e.split.train) + len(e.split.test) == 64 for e in envs)


def _client_update(
    env: ClientEnv, sent: ArrayRecord, cfg: ClientConfig, server_round: int
) -> tuple[dict[str, torch.Tensor], int]:
    """The real FedAvg client routine's reply and its reported examples."""
    config = ConfigRecord({**client_config_record(cfg), protocol.SERVER_ROUND: server_round})
    reply, metrics = CLIENT_ROUTINES.get("fedavg")().train(env, sent, config)
    return reply.to_torch_state_dict(), int(metrics[protocol.NUM_EXAMPLES])


@pytest.mark.parametrize(
    "cfg",
    [
        ClientConfig(local_epochs=1, batch_size=16, optimizer="adam", lr=0.003),
        ClientConfig(
            local_epochs=2, batch_size=8, optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=1e-3
        ),
        ClientConfig(local_epochs=1, batch_size=16, optimizer="adamw", lr=0.003),
    ],
    ids=["adam", "sgd-momentum-weight-decay", "adamw-weight-decay"],
)
def test_words_reads_every_real_clients_word_set_from_its_update(cfg: ClientConfig) -> None:
    # Eight speaking roles, two FedAvg rounds of the real client routine in-process.
    bundle = load_dataset(WORDS)
    spec = ClientSpec(TRANSFORMER, WORDS, num_clients=8, seed=0)
    envs = [ClientEnv.create(spec, c, RecordDict()) for c in range(8)]
    model = build_model(TRANSFORMER, input_spec(bundle), seed=0)
    public = PublicData(bundle.test_images, bundle.test_labels)
    analysis = EmbeddingWords(WordsParams())
    for server_round in (1, 2):
        sent = {k: v.detach().clone() for k, v in model.state_dict().items()}
        replies = []
        for env in envs:
            shared, examples = _client_update(env, ArrayRecord(sent), cfg, server_round)
            model.load_state_dict(shared)
            observation = observed_update(
                model, sent, TRANSFORMER, input_spec(bundle), bundle, cfg, examples
            )
            leak = analysis.analyse(LeakInput(observation, public))
            assert isinstance(leak, WordsLeak)
            truth = input_tokens(env.train_data[0])
            score, prior = score_tokens(leak.tokens, truth), score_tokens(leak.prior, truth)
            assert score.f1 >= 0.99, (env.partition_id, score)
            assert prior.f1 < 0.75 and score.f1 - prior.f1 > 0.25, prior
            replies.append(shared)
        model.load_state_dict({k: torch.stack([r[k] for r in replies]).mean(0) for k in sent})


def test_words_without_the_client_data_reads_nothing() -> None:
    # An update that moved no embedding row (a client that did not train) names no token.
    bundle = load_dataset(WORDS)
    model = build_model(TRANSFORMER, input_spec(bundle), seed=0)
    sent = {k: v.detach().clone() for k, v in model.state_dict().items()}
    cfg = ClientConfig(optimizer="sgd", lr=0.1, weight_decay=1e-2, batch_size=16)
    with torch.no_grad():
        model.get_parameter(TOKEN_EMBEDDING).mul_(1 - 0.1 * 1e-2)  # weight decay alone, one step
    observation = observed_update(model, sent, TRANSFORMER, input_spec(bundle), bundle, cfg, 16)
    leak = EmbeddingWords(WordsParams()).analyse(
        LeakInput(observation, PublicData(bundle.test_images, bundle.test_labels))
    )
    assert len(leak.tokens) == 0


def test_text_datasets_declare_their_modality_and_a_folder_of_files_is_one_group_each(
    tmp_path: Path,
) -> None:
    for number, text in enumerate(["to be or not to be " * 40, "my pin is 4 8 1 5 " * 50]):
        (tmp_path / f"client{number}.txt").write_text(text)
    data = DataConfig(dataset="text-folder-words", root=str(tmp_path))
    bundle = load_dataset(data)
    assert modality_of(DATASETS.get("text-folder-words")) == TEXT
    assert set(bundle.train_labels.tolist()) == {0, 1}
    second = bundle.train_images[bundle.train_labels == 1]
    assert set(bundle.vocabulary[int(i)] for i in second.unique()) == {"my", "pin", "is", *"4815"}


# The one real Flower simulation of a text federation (Ray actors, the audit's path, the run
# folder): 2 rounds of the shipped scenario, about 75 s.
@pytest.mark.slow
def test_the_shakespeare_scenario_learns_and_its_audit_reads_every_clients_words(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    assert main(["run", "shakespeare", "--out", str(out), "--set", "federation.rounds=2"]) == 0
    metrics = pd.read_csv(out / "metrics.csv")
    accuracy = metrics["test-acc"].to_numpy()
    assert accuracy[-1] > accuracy[0] + 0.01 and accuracy[-1] > 0.12, accuracy
    leaks = pd.read_csv(out / "leaks.csv")
    assert len(leaks) == 2 * 8 * 2 and set(leaks["kind"]) == {"words", "membership"}
    assert leaks["words-f1"].min() >= 0.99, leaks["words-f1"]
    membership = leaks[leaks["kind"] == "membership"]  # loss-drop, every client every round
    assert (membership["membership-auc-low"] <= membership["membership-auc"]).all()
    assert membership["membership-auc"].median() > 0.6, membership["membership-auc"]
    assert leaks["words-prior-f1"].max() < 0.75
    planted = metrics["exposure-client0-x10"].iloc[-1]  # [memorisation]: measured every round
    assert planted > max(metrics[f"exposure-reference{i}"].iloc[-1] for i in range(2)) + 3
    summary = (out / "summary.md").read_text()
    assert "words: F1" in summary


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_canary_planted_ten_times_is_exposed_more_than_once_more_than_never(seed: int) -> None:
    # Two speaking roles train FedAvg rounds in-process with the real client routine:
    # client 0 holds its canary 10 times, client 1 its own once; five are never planted.
    memorisation = MemorisationConfig(
        enabled=True, digits=4, clients=(0, 1), repetitions=(10, 1), references=5, seed=seed
    )
    spec = ClientSpec(TRANSFORMER, WORDS, num_clients=2, seed=seed, memorisation=memorisation)
    envs = [ClientEnv.create(spec, c, RecordDict()) for c in range(2)]
    assert [e.train_size - len(e.split.train) for e in envs] == [10, 1]
    bundle = load_dataset(WORDS)
    canaries = PlantedCanaries.of(memorisation, bundle.vocabulary)
    model = build_model(TRANSFORMER, input_spec(bundle), seed=seed)
    cfg = ClientConfig(local_epochs=2, batch_size=16, optimizer="adam", lr=0.003)
    for server_round in range(1, 6):
        sent = ArrayRecord({k: v.detach().clone() for k, v in model.state_dict().items()})
        replies = [_client_update(env, sent, cfg, server_round)[0] for env in envs]
        model.load_state_dict({k: (replies[0][k] + replies[1][k]) / 2 for k in replies[0]})
    exposure = canaries.measure(model)
    ten, once = exposure["exposure-client0-x10"], exposure["exposure-client1-x1"]
    # A never-planted canary's exposure is random: P(exposure >= e) = 2**-e (mean 1.4 bits),
    # so the references' median stands for "never planted".
    never = float(torch.tensor([exposure[f"exposure-reference{i}"] for i in range(5)]).median())
    assert ten > once + 1 and once > never + 2, exposure


def test_fedsim_list_shows_each_datasets_and_models_modality(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    for kind, text, image in (
        ("datasets", "shakespeare", "mnist-embedded"),
        ("models", "char-lstm", "lenet-zhu"),
    ):
        assert main(["list", kind]) == 0
        rows = {
            line.split("│")[2].strip(): line
            for line in capsys.readouterr().out.splitlines()
            if line.count("│") > 4
        }
        assert rows[text].split("│")[3].strip() == "text"
        assert rows[image].split("│")[3].strip() == "image"


def test_the_memory_check_counts_token_windows_not_images_of_them() -> None:
    # Found running the anchors bench: every window of char-level Shakespeare (47,769 of
    # 81 ids) was priced as a 32x32 image of 81 channels, 14.8 GiB a process, and refused.

    text = DataConfig(dataset="shakespeare")
    raw = load_raw(text)
    windows = len(raw.train_labels) + len(raw.test_labels)
    assert held_bytes(raw, text) == windows * raw.train_images.shape[1] * 8
    check_data_fits(text, FederationConfig(num_clients=20), BackendConfig())
    images = DataConfig(dataset="mnist-embedded", image_size=1024)
    with pytest.raises(ScenarioError, match=r"data\.image-size = 1024: .* GiB in each of"):
        check_data_fits(images, FederationConfig(num_clients=4), BackendConfig())
