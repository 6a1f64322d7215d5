"""DAGER's reach: batch x length against the transformer's width, on a probe and on real
multi-step updates (plain SGD and Adam), real Shakespeare word windows.

For each cell a random-init ``TransformerBody`` (vocabulary 2,000 of the first 200 roles'
words, 2 layers, 4 heads) sees one client's windows; the server reads the first two attention
layers' weight gradient (probe) or ``(sent - uploaded) / lr`` after the client's local steps
(update), and DAGER's span check rebuilds sequences. Printed per cell: the tokens in the
client's data against the width, the layers' ranks, exact sequences, token accuracy of the
best match per true sequence, and seconds on one thread.

    .venv/bin/python bench/text_reconstruction.py --widths 128 256 --seeds 3 > reach.md
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

from fedsim.core.params.analytic import DagerParams
from fedsim.text.dager import attention_weight, dager
from fedsim.text.models import TransformerBody
from fedsim.text.shakespeare import roles
from fedsim.text.tokens import windows, word_vocabulary

CELLS = ((1, 16), (1, 32), (2, 32), (4, 16), (4, 32), (8, 16), (8, 32), (16, 16))


def _client(width: int, batch: int, length: int, seed: int, ids: np.ndarray, vocab: int):
    torch.manual_seed(seed)
    body = TransformerBody(vocab, 64, width, 2, 4)
    head = torch.nn.Linear(width, vocab)
    every = windows(ids, length)
    order = torch.randperm(len(every), generator=torch.Generator().manual_seed(seed))
    data = torch.from_numpy(every[order[:batch].numpy()])
    return body, head, data


def _observe(body, head, data, mode: str, steps: int, lr: float) -> tuple[torch.Tensor, ...]:
    names = [attention_weight(body, i) for i in (0, 1)]
    weights = dict(body.named_parameters())
    sent = [weights[n].detach().clone() for n in names]

    def loss_of(batch: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(head(body(batch[:, :-1])).flatten(0, 1), batch[:, 1:].flatten())

    if mode == "probe":
        return tuple(torch.autograd.grad(loss_of(data), [weights[n] for n in names]))
    params = [*body.parameters(), *head.parameters()]
    optimiser = torch.optim.SGD(params, lr=lr) if mode == "sgd" else torch.optim.Adam(params, lr=lr)
    snapshot = {k: v.detach().clone() for k, v in body.state_dict().items()}
    for step in range(steps):  # the client's data split into `steps` minibatches, one epoch
        batch = data[step::steps]
        optimiser.zero_grad()
        loss_of(batch).backward()
        optimiser.step()
    update = tuple((s - weights[n].detach()) / lr for s, n in zip(sent, names, strict=True))
    body.load_state_dict(snapshot)  # the attacker checks against the weights it sent
    return update


def _scores(found: torch.Tensor, truth: torch.Tensor) -> tuple[float, float]:
    if not len(found):
        return 0.0, 0.0
    exact = len({tuple(s) for s in found.tolist()} & {tuple(s) for s in truth.tolist()})
    matches = (truth[:, None, :] == found[None, :, :]).float().mean(-1).max(dim=1).values
    return exact / len(truth), float(matches.mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=["probe", "sgd", "adam"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    spoken = [role.text for role in roles()[:200]]
    vocabulary = word_vocabulary(spoken, 2000)
    ids = np.concatenate([vocabulary.encode(text) for text in spoken])
    lrs = {"probe": 1.0, "sgd": 0.05, "adam": 1e-3}
    print("| width | mode | windows x length | tokens | ranks | exact | token acc | s |")
    print("|---|---|---|---|---|---|---|---|")
    for width in args.widths:
        for mode in args.modes:
            for batch, length in CELLS:
                steps = 1 if mode == "probe" else min(batch, 4)
                rows = []
                for seed in range(args.seeds):
                    body, head, data = _client(width, batch, length, seed, ids, len(vocabulary))
                    observed = _observe(body, head, data, mode, steps, lrs[mode])
                    start = time.perf_counter()
                    result = dager(body, (observed[0], observed[1]), length, DagerParams())
                    seconds = time.perf_counter() - start
                    rows.append((*_scores(result.sequences, data[:, :-1]), seconds, result.ranks))
                exact, accuracy, seconds = (float(np.mean([r[i] for r in rows])) for i in range(3))
                ranks = "/".join(f"{r[3][0]},{r[3][1]}" for r in rows)
                label = mode if mode == "probe" else f"{mode} {steps} steps"
                print(
                    f"| {width} | {label} | {batch} x {length} | {batch * length} | {ranks} "
                    f"| {exact:.2f} | {accuracy:.2f} | {seconds:.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
