"""``dager`` and ``tag`` as the audit runs them: the registered attacks on a probe of real
Shakespeare word windows (20 tokens) at the sent ``word-transformer`` (width 128), scored by
the audit's text scorer. Per batch size and seed: exact-sequence rate, token accuracy,
ROUGE-1 and seconds on one thread.

    .venv/bin/python bench/text_attacks.py --batches 1 2 4 6 --seeds 3 --tag-steps 100
"""

from __future__ import annotations

import argparse

import torch

from fedsim.attacks.registry import resolve_attack
from fedsim.audit.experiment import gradient_probe
from fedsim.core.config import DataConfig, ModelConfig
from fedsim.core.data import load_dataset
from fedsim.core.modality import input_spec
from fedsim.core.models import build_model
from fedsim.text.scoring import score_sequences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 6])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--tag-steps", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(1)
    bundle = load_dataset(DataConfig(dataset="shakespeare-words"))
    spec, config = input_spec(bundle), ModelConfig(name="word-transformer")
    attacks = {
        "dager": resolve_attack("dager"),
        "tag": resolve_attack("tag", {"steps": args.tag_steps}),
    }
    print("| attack | batch x length | seed | exact | token acc | ROUGE-1 | s |")
    print("|---|---|---|---|---|---|---|")
    for batch in args.batches:
        for seed in range(args.seeds):
            model = build_model(config, spec, seed=seed)
            generator = torch.Generator().manual_seed(seed)
            chosen = torch.randperm(len(bundle.train_images), generator=generator)[:batch]
            probe = gradient_probe(
                model,
                config,
                spec,
                bundle.train_images[chosen],
                bundle.train_labels[chosen],
                bundle.normalization,
            )
            for name, attack in attacks.items():
                rec = attack.create().reconstruct(probe.observation, seed=seed)
                score = score_sequences(rec.images, probe.truth.images)
                print(
                    f"| {name} | {batch} x {spec.image_size} | {seed} | {score.exact_rate:.2f} "
                    f"| {score.token_accuracy:.2f} | {score.rouge1:.2f} | {rec.seconds:.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
