"""The model zoo: every network is an extractor followed by a classifier.

Splitting every model the same way lets FedSplit and FedCG share only the
classifier of any architecture, and lets attacks address layers by name.
``extractor`` maps images to feature maps; ``classifier`` starts with a
flatten and ends with the logits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from fedsim.core.config import ModelConfig
from fedsim.core.raw import IMAGE
from fedsim.core.registry import Registry


@dataclass(frozen=True)
class InputSpec:
    """What a model is built for: image channels, side length and classes; for token
    sequences (``modality = "text"``), one channel, the sequence length and the vocabulary."""

    channels: int
    image_size: int
    num_classes: int
    modality: str = IMAGE


class SplitNet(nn.Module):
    """``classifier(extractor(x))``; parameter names start with those prefixes."""

    def __init__(self, extractor: nn.Module, classifier: nn.Module) -> None:
        super().__init__()
        self.extractor = extractor
        self.classifier = classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.extractor(x))


ModelBuilder = Callable[[InputSpec], SplitNet]
MODELS: Registry[ModelBuilder] = Registry("model", ("fedsim.text",), group="fedsim.models")
INITS: Registry[Callable[[nn.Module], None]] = Registry("init scheme", group="fedsim.inits")


def _feature_dim(extractor: nn.Module, spec: InputSpec) -> int:
    with torch.no_grad():
        probe = torch.zeros(1, spec.channels, spec.image_size, spec.image_size)
        return int(extractor(probe).numel())


def _classifier_mlp(in_features: int, num_classes: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(in_features, 120),
        nn.Sigmoid(),
        nn.Linear(120, 84),
        nn.Sigmoid(),
        nn.Linear(84, num_classes),
    )


@MODELS.register("lenet-zhu")
def lenet_zhu(spec: InputSpec) -> SplitNet:
    """DLG's LeNet (Zhu et al. 2019): three strided 5x5 convs with Sigmoid."""
    extractor = nn.Sequential(
        nn.Conv2d(spec.channels, 12, 5, padding=2, stride=2),
        nn.Sigmoid(),
        nn.Conv2d(12, 12, 5, padding=2, stride=2),
        nn.Sigmoid(),
        nn.Conv2d(12, 12, 5, padding=2, stride=1),
        nn.Sigmoid(),
    )
    dim = _feature_dim(extractor, spec)
    return SplitNet(extractor, nn.Sequential(nn.Flatten(), nn.Linear(dim, spec.num_classes)))


@MODELS.register("lenet-sapag")
def lenet_sapag(spec: InputSpec) -> SplitNet:
    """SAPAG's LeNet: four stride-1 5x5 convs with Sigmoid, then one Linear."""
    layers: list[nn.Module] = []
    channels = spec.channels
    for _ in range(4):
        layers += [nn.Conv2d(channels, 12, 5, padding=2, stride=1), nn.Sigmoid()]
        channels = 12
    extractor = nn.Sequential(*layers)
    dim = _feature_dim(extractor, spec)
    return SplitNet(extractor, nn.Sequential(nn.Flatten(), nn.Linear(dim, spec.num_classes)))


@MODELS.register("lenet5-grnn")
def lenet5_grnn(spec: InputSpec) -> SplitNet:
    """GRNN's LeNet-5: conv-Sigmoid-MaxPool twice, then a 3-layer Sigmoid MLP."""
    extractor = nn.Sequential(
        nn.Conv2d(spec.channels, 6, 5),
        nn.Sigmoid(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5),
        nn.Sigmoid(),
        nn.MaxPool2d(2),
    )
    return SplitNet(extractor, _classifier_mlp(_feature_dim(extractor, spec), spec.num_classes))


@MODELS.register("lenet5-split")
def lenet5_split(spec: InputSpec) -> SplitNet:
    """FedCG's LeNet-5: conv-AvgPool-Sigmoid twice (features 16x5x5 at 32x32)."""
    extractor = nn.Sequential(
        nn.Conv2d(spec.channels, 6, 5),
        nn.AvgPool2d(2),
        nn.Sigmoid(),
        nn.Conv2d(6, 16, 5),
        nn.AvgPool2d(2),
        nn.Sigmoid(),
    )
    return SplitNet(extractor, _classifier_mlp(_feature_dim(extractor, spec), spec.num_classes))


@MODELS.register("mlp-2nn")
def mlp_2nn(spec: InputSpec) -> SplitNet:
    """FedAvg's 2NN (McMahan et al. 2017): two 200-unit ReLU layers, then the logits.

    The hidden layers are the extractor, so FedSplit shares the output layer
    only; under FedAvg the first layer sees the raw pixels, which is what
    analytic attacks on fully connected layers read back (199,210 parameters
    at 28x28, 1 channel, 10 classes, as the paper counts).
    """
    extractor = nn.Sequential(
        nn.Flatten(),
        nn.Linear(spec.channels * spec.image_size**2, 200),
        nn.ReLU(),
        nn.Linear(200, 200),
        nn.ReLU(),
    )
    return SplitNet(extractor, nn.Sequential(nn.Flatten(), nn.Linear(200, spec.num_classes)))


@MODELS.register("logreg")
def logreg(spec: InputSpec) -> SplitNet:
    """Multinomial logistic regression: one linear layer on the flattened input.

    The extractor only flattens (no parameters), the classifier is the linear
    layer: FedProx's model for its Synthetic data (60 features, 10 classes: 610
    parameters). On images it is softmax regression on the pixels.
    """
    inputs = spec.channels * spec.image_size**2
    return SplitNet(nn.Flatten(), nn.Sequential(nn.Flatten(), nn.Linear(inputs, spec.num_classes)))


@MODELS.register("cnn-fedavg")
def cnn_fedavg(spec: InputSpec) -> SplitNet:
    """FedAvg's CNN (McMahan et al. 2017): two 5x5 "same" convs (32, 64), each followed by
    2x2 max-pooling, a 512-unit ReLU layer, then the logits (1,663,370 parameters at
    28x28, 1 channel, 10 classes)."""
    extractor = nn.Sequential(
        nn.Conv2d(spec.channels, 32, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
    )
    classifier = nn.Sequential(
        nn.Flatten(),
        nn.Linear(_feature_dim(extractor, spec), 512),
        nn.ReLU(),
        nn.Linear(512, spec.num_classes),
    )
    return SplitNet(extractor, classifier)


class _BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, act: Callable[[], nn.Module]) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.act1, self.act2 = act(), act()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act1(self.bn1(self.conv1(x)))
        return self.act2(self.bn2(self.conv2(out)) + self.shortcut(x))


def _resnet18(spec: InputSpec, act: Callable[[], nn.Module]) -> SplitNet:
    """CIFAR-style ResNet-18: 3x3 stem, no max-pool, four stages of two blocks."""
    layers: list[nn.Module] = [
        nn.Conv2d(spec.channels, 64, 3, 1, 1, bias=False),
        nn.BatchNorm2d(64),
        act(),
    ]
    c_in = 64
    for c_out, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [_BasicBlock(c_in, c_out, stride, act), _BasicBlock(c_out, c_out, 1, act)]
        c_in = c_out
    layers.append(nn.AdaptiveAvgPool2d(1))
    return SplitNet(
        nn.Sequential(*layers), nn.Sequential(nn.Flatten(), nn.Linear(512, spec.num_classes))
    )


@MODELS.register("resnet18")
def resnet18(spec: InputSpec) -> SplitNet:
    """ResNet-18 with ReLU activations (extractor + linear classifier)."""
    return _resnet18(spec, lambda: nn.ReLU(inplace=False))


@MODELS.register("resnet18-sigmoid")
def resnet18_sigmoid(spec: InputSpec) -> SplitNet:
    """ResNet-18 with Sigmoid activations (the SAPAG setting)."""
    return _resnet18(spec, nn.Sigmoid)


def _weight_layers(model: nn.Module) -> list[nn.Conv2d | nn.Linear | nn.ConvTranspose2d]:
    return [m for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear | nn.ConvTranspose2d)]


@INITS.register("default")
def init_default(model: nn.Module) -> None:
    """PyTorch's own initialisation (Kaiming-uniform), left as built."""


@INITS.register("uniform")
def init_uniform(model: nn.Module) -> None:
    """All conv/linear weights and biases U(-0.5, 0.5): the DLG setting."""
    for layer in _weight_layers(model):
        nn.init.uniform_(layer.weight, -0.5, 0.5)
        if layer.bias is not None:
            nn.init.uniform_(layer.bias, -0.5, 0.5)


@INITS.register("xavier-normal")
def init_xavier_normal(model: nn.Module) -> None:
    """Xavier-normal weights (gain 1), zero biases: the SAPAG setting."""
    for layer in _weight_layers(model):
        nn.init.xavier_normal_(layer.weight, gain=1.0)
        if layer.bias is not None:
            nn.init.zeros_(layer.bias)


def batchnorm_layers(model: nn.Module) -> dict[str, nn.modules.batchnorm._BatchNorm]:
    """The model's BatchNorm layers by module name."""
    return {
        name: module
        for name, module in model.named_modules()
        if isinstance(module, nn.modules.batchnorm._BatchNorm)
    }


@contextmanager
def recording_batch_statistics(model: nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    """While open, every forward records what each BatchNorm layer's input has.

    Keyed like the layers' buffers: ``<layer>.running_mean`` (the batch
    mean per channel) and ``<layer>.running_var`` (the biased batch
    variance); differentiable, as the forward that computed them.
    """
    found: dict[str, torch.Tensor] = {}

    def record(name: str) -> Callable[[nn.Module, tuple[torch.Tensor, ...]], None]:
        def hook(module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            dims = [d for d in range(args[0].dim()) if d != 1]
            found[f"{name}.running_mean"] = args[0].mean(dim=dims)
            found[f"{name}.running_var"] = args[0].var(dim=dims, unbiased=False)

        return hook

    handles = [m.register_forward_pre_hook(record(n)) for n, m in batchnorm_layers(model).items()]
    try:
        yield found
    finally:
        for handle in handles:
            handle.remove()


def batch_statistics(model: nn.Module, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
    """What each BatchNorm layer normalises ``inputs`` with in a train-mode forward.

    Keyed like the layers' buffers (see :func:`recording_batch_statistics`),
    so an eval-mode forward with these as buffers gives the train-mode
    forward's outputs. The model's buffers and mode are left as they were.
    """
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    was_training = model.training
    try:
        model.train()
        with torch.no_grad(), recording_batch_statistics(model) as found:
            model(inputs)
    finally:
        model.load_state_dict(saved)
        model.train(was_training)
    return dict(found)


def batchnorm_counts(model: nn.Module, input_shape: tuple[int, ...]) -> dict[str, int]:
    """Values each BatchNorm layer averages per channel for inputs of ``input_shape``.

    A layer's running variance is the unbiased batch variance: reading it
    back as the biased one needs this count.
    """
    counts: dict[str, int] = {}

    def record(name: str) -> Callable[[nn.Module, tuple[torch.Tensor, ...]], None]:
        def hook(module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            counts[name] = args[0].numel() // args[0].shape[1]

        return hook

    handles = [m.register_forward_pre_hook(record(n)) for n, m in batchnorm_layers(model).items()]
    was_training = model.training
    try:
        model.eval()  # no buffer changes; the shapes are the same in both modes
        with torch.no_grad():
            model(torch.zeros(input_shape, device=next(model.parameters()).device))
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return counts


def build_loaded_model(
    cfg: ModelConfig,
    spec: InputSpec,
    seed: int,
    state: Mapping[str, torch.Tensor] | None,
    device: torch.device,
) -> SplitNet:
    """A seeded zoo model on ``device``, loaded with ``state`` (which may be partial)."""
    model = build_model(cfg, spec, seed=seed)
    if state is not None:
        model.load_state_dict(state, strict=False)
    return model.to(device)


def build_model(cfg: ModelConfig, spec: InputSpec, seed: int | None = None) -> SplitNet:
    """Build a zoo model and initialise it (seeded when ``seed`` is given)."""
    builder, init = MODELS.get(cfg.name), INITS.get(cfg.init)
    if seed is None:
        model = builder(spec)
        init(model)
        return model
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = builder(spec)
        init(model)
    return model
