"""Client-side defences: what a client does to what it uploads, before the server sees it.

The threat is fedsim's honest-but-curious server, which reads every client's
reply. Flower's central-DP wrappers (a scenario's ``[central-dp]``,
:mod:`fedsim.strategies.central_dp`) add noise to the *aggregate* on the server:
each client's reply (or, behind secure aggregation, their sum) reaches the server
before the noise, so they protect the released model from third parties but not
the clients from a curious server (fedsim's audit attacks exactly those replies).
Defences that do protect against it act on the client, so the server only ever
holds the defended upload; a scenario lists them as ``[[defences]]`` tables:

- ``gaussian`` (``sigma``) and ``laplace`` (``scale``): i.i.d. noise added to every
  coordinate of the update ``w - w_global``;
- ``clip`` (``max-norm``): the update's L2 norm (over all uploaded parameters)
  scaled down to at most ``max-norm``;
- ``prune`` (``share``, ``scope``): the smallest ``share`` of the update's magnitudes
  zeroed, per tensor or globally (DLG's own defence, Zhu et al. 2019);
- ``quantize`` (``bits``, or ``half = true``): symmetric uniform quantisation of each
  tensor, or a cast to half precision;
- ``soteria`` (``share``): representation perturbation (Sun et al., CVPR 2021), for the
  audit's ``probe`` threat model only: in the probed gradient, the weight gradient of
  the first linear layer after the extractor loses the columns of the ``share`` of
  its input features whose input sensitivity ``||dr_f/dX|| / (r_f + 0.1)`` is
  smallest; the client's training uploads are left as trained;
- ``dp-sgd`` (``noise-multiplier``, ``max-grad-norm``, ``delta``, ``accountant``):
  local training with Opacus, per-example gradient clipping and Gaussian noise
  at every step; the client reports the epsilon spent so far (record-level
  (epsilon, delta)-DP of its own data, Opacus's accountant) as ``dp-epsilon``
  every round it trains.

Upload defences chain in the listed order, like pfl-research's postprocessors
(``clip`` then ``gaussian`` is local DP-FedAvg's mechanism, without its
accounting). Noise comes from generators seeded by the scenario seed, the round
and the partition, so runs repeat exactly. Only trainable parameters are
defended: normalisation running statistics (FedCG's generator) are uploaded as
computed, as Opacus refuses such layers for the same reason. Flower's own
``LocalDpMod`` is the clip-and-noise mechanism too, unseeded and only for
replies with the keys they were sent.

Under the audit's ``probe`` threat model the server attacks the gradient of one
batch, the upload of a client sharing gradients (the papers' setting; FedCG
Table 2 adds its noise "to shared gradients"): the same chain acts on that
gradient, in gradient units, and ``dp-sgd`` clips it and adds the noise of one
DP-SGD step (exact for a probe batch of one; a larger batch is clipped as a whole).
``soteria`` acts only there: it reads the probed batch and the model at the sent
weights (a :class:`ProbeContext`, which every other defence ignores), and
validation refuses it under the other threat models, where an update is many
steps of training it would have to perturb at each.

``dp-sgd`` covers :func:`fedsim.core.training.train_local`, hence FedAvg,
FedSplit, local and FedCG's first stage, and FedCG's GAN stage: there only the
discriminator reads data (the extractor's features of real images), so its
steps are DP-SGD steps (:meth:`DPTraining.private_gradients`, per-example
clipping and noise, accounted with the first stage's), its BatchNorm layers
frozen at their running statistics so that no example reaches another's
output; the uploaded generator learns only through it, so it is covered by
post-processing. Limits: it refuses FedProx, whose proximal term Opacus's
optimiser would drop, and models with BatchNorm. The accountant assumes
Poisson sampling at rate batch/examples, where clients draw shuffled batches
(the usual approximation).
"""

# Importing the defences registers them (DEFENCES finds its entries by import).
from fedsim.clients.defences import compression, noise, soteria
from fedsim.clients.defences.base import DEFENCES, Defence, ProbeContext, global_norm
from fedsim.clients.defences.chain import (
    check_defences,
    defence_chain,
    protect_probe,
    protect_upload,
    resolve_defences,
    train_defended,
)
from fedsim.clients.defences.dp_sgd import DPTraining

__all__ = [
    "DEFENCES",
    "DPTraining",
    "Defence",
    "ProbeContext",
    "check_defences",
    "compression",
    "defence_chain",
    "global_norm",
    "noise",
    "protect_probe",
    "protect_upload",
    "resolve_defences",
    "soteria",
    "train_defended",
]
