"""FedCG's conditional GAN on extractor features (Wu et al. 2022).

The generator ``G(z, y)`` maps Gaussian noise and a label to a feature map
shaped like the extractor's output (16x5x5 for ``lenet5-split`` at 32x32); the
discriminator ``D(f, y)`` tells extractor features from generated ones. Both
follow the brief's DCGAN variant: transposed / spectral-norm 2x2 convolutions
that grow or shrink the map by one pixel each, BatchNorm and LeakyReLU(0.2)
between, weights N(0, 0.02) and BatchNorm scales N(1, 0.02).

:class:`GanSplitNet` is a zoo :class:`~fedsim.core.models.SplitNet` that also holds
a generator and a discriminator, so its parameter names are ``extractor.*``,
``classifier.*``, ``generator.*`` and ``discriminator.*``. FedCG's clients
train it, its server distils the ``generator.*`` and ``classifier.*`` parts,
and the privacy audit rebuilds a client's generator from the ``generator.*``
tensors the server receives (:func:`build_generator`).
"""

from __future__ import annotations

import torch
from torch import nn

from fedsim.core.config import ModelConfig
from fedsim.core.models import InputSpec, SplitNet, build_model

NOISE_DIM = 100
HIDDEN = (512, 256, 128)  # generator widths; the discriminator mirrors them


def feature_shape(extractor: nn.Module, spec: InputSpec) -> tuple[int, int, int]:
    """``(channels, side, side)`` of the extractor's output for one image."""
    with torch.no_grad():
        out = extractor(torch.zeros(1, spec.channels, spec.image_size, spec.image_size))
    if out.dim() != 4 or out.shape[-1] != out.shape[-2] or out.shape[-1] < len(HIDDEN) + 1:
        raise ValueError(
            f"FedCG needs square feature maps of side >= {len(HIDDEN) + 1}, "
            f"got {tuple(out.shape[1:])}"
        )
    return int(out.shape[1]), int(out.shape[2]), int(out.shape[3])


def dcgan_init(module: nn.Module) -> None:
    """DCGAN initialisation: conv weights N(0, 0.02), BatchNorm N(1, 0.02) and zero shift."""
    for layer in module.modules():
        if isinstance(layer, nn.Conv2d | nn.ConvTranspose2d):
            nn.init.normal_(layer.weight, 0.0, 0.02)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
        elif isinstance(layer, nn.BatchNorm2d):
            nn.init.normal_(layer.weight, 1.0, 0.02)
            nn.init.zeros_(layer.bias)


class ConditionalGenerator(nn.Module):
    """``G(z, y)``: label embedding joined to ``z`` as a 1x1 map, up to the feature map.

    Three ConvTranspose(k=2)-BatchNorm-LeakyReLU blocks (512, 256, 128 channels;
    1x1 -> 4x4) and a last transposed convolution to the feature channels and
    side, then a sigmoid (the extractors end in one too).
    """

    def __init__(self, num_classes: int, shape: tuple[int, int, int], noise_dim: int = NOISE_DIM):
        super().__init__()
        channels, side, _ = shape
        self.noise_dim = noise_dim
        self.num_classes = num_classes
        self.label_embedding = nn.Embedding(num_classes, num_classes)
        layers: list[nn.Module] = []
        c_in = noise_dim + num_classes
        for c_out in HIDDEN:
            layers += [
                nn.ConvTranspose2d(c_in, c_out, 2, bias=False),
                nn.BatchNorm2d(c_out),
                nn.LeakyReLU(0.2),
            ]
            c_in = c_out
        layers += [nn.ConvTranspose2d(c_in, channels, side - len(HIDDEN)), nn.Sigmoid()]
        self.net = nn.Sequential(*layers)
        dcgan_init(self)

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        code = torch.cat([z, self.label_embedding(y)], dim=1)
        return self.net(code[:, :, None, None])


class ConditionalDiscriminator(nn.Module):
    """``D(f, y)``: probability that features ``f`` of class ``y`` come from the extractor.

    The label embedding is broadcast to a ``classes x side x side`` map and
    joined to the features; three spectral-norm Conv(k=2)-BatchNorm-LeakyReLU
    blocks (128, 256, 512 channels), a last spectral-norm convolution to one
    value, and a sigmoid.
    """

    def __init__(self, num_classes: int, shape: tuple[int, int, int]) -> None:
        super().__init__()
        channels, side, _ = shape
        self.label_embedding = nn.Embedding(num_classes, num_classes)
        convs: list[nn.Conv2d] = []
        layers: list[nn.Module] = []
        c_in = channels + num_classes
        for c_out in reversed(HIDDEN):
            convs.append(nn.Conv2d(c_in, c_out, 2, bias=False))
            layers += [convs[-1], nn.BatchNorm2d(c_out), nn.LeakyReLU(0.2)]
            c_in = c_out
        convs.append(nn.Conv2d(c_in, 1, side - len(HIDDEN)))
        layers += [convs[-1], nn.Sigmoid()]
        self.net = nn.Sequential(*layers)
        dcgan_init(self)
        # Spectral norm wraps the weights after they are initialised.
        for conv in convs:
            nn.utils.parametrizations.spectral_norm(conv)

    def forward(self, features: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        side = features.shape[-1]
        labels = self.label_embedding(y)[:, :, None, None].expand(-1, -1, side, side)
        return self.net(torch.cat([features, labels], dim=1)).flatten()


class GanSplitNet(SplitNet):
    """A zoo network plus FedCG's generator and discriminator on its features."""

    def __init__(
        self,
        net: SplitNet,
        generator: ConditionalGenerator,
        discriminator: ConditionalDiscriminator,
    ) -> None:
        super().__init__(net.extractor, net.classifier)
        self.generator = generator
        self.discriminator = discriminator


def build_generator(cfg: ModelConfig, spec: InputSpec, seed: int = 0) -> ConditionalGenerator:
    """The generator FedCG pairs with zoo model ``cfg`` (what the audit rebuilds)."""
    return build_gan_split_net(cfg, spec, seed).generator


def build_gan_split_net(cfg: ModelConfig, spec: InputSpec, seed: int) -> GanSplitNet:
    """Zoo model ``cfg`` with a generator and a discriminator, all seeded by ``seed``."""
    net = build_model(cfg, spec, seed=seed)
    shape = feature_shape(net.extractor, spec)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        generator = ConditionalGenerator(spec.num_classes, shape)
        discriminator = ConditionalDiscriminator(spec.num_classes, shape)
    return GanSplitNet(net, generator, discriminator)
