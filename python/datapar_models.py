"""PyTorch twins of datapar's C++ models (include/datapar/models/).

Each module here has the same state_dict() keys, shapes and order as its C++ twin, and
computes the same function, so weights move both ways:

    import torch, datapar_models
    net = datapar_models.ResNet18()
    net.load_state_dict(torch.load("model.pt"))      # written by datapar::save_state_dict
    torch.save(dict(net.state_dict()), "model.pt")   # read by datapar::load_state_dict_file

(libtorch 1.13 cannot unpickle an OrderedDict, hence dict(...) when saving for C++.)
tests/models/python_models_test.cc checks the names, shapes and outputs against C++.
"""
import torch
from torch import nn
from torch.nn import functional as F


class Mlp(nn.Module):
    """datapar::models::Mlp: flatten, then Linear/ReLU layers; keys layers.0.weight, ..."""

    def __init__(self, sizes=(784, 512, 512, 10)):
        super().__init__()
        if len(sizes) < 2:
            raise ValueError("Mlp: give at least input and output sizes.")
        layers = []
        for i in range(len(sizes) - 1):
            layers.append(nn.Linear(sizes[i], sizes[i + 1]))
            if i + 2 < len(sizes):
                layers.append(nn.ReLU())
        self.layers = nn.Sequential(*layers)

    def forward(self, x):
        return self.layers(x.flatten(1))


class LeNet(nn.Module):
    """datapar::models::LeNet: d2l's LeNet-5 for 1x28x28 images; keys net.0.weight, ..."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 6, kernel_size=5, padding=2), nn.Sigmoid(),
            nn.AvgPool2d(kernel_size=2, stride=2),
            nn.Conv2d(6, 16, kernel_size=5), nn.Sigmoid(),
            nn.AvgPool2d(kernel_size=2, stride=2),
            nn.Flatten(),
            nn.Linear(400, 120), nn.Sigmoid(),
            nn.Linear(120, 84), nn.Sigmoid(),
            nn.Linear(84, 10))

    def forward(self, x):
        return self.net(x)


class Residual(nn.Module):
    """d2l's Residual block (datapar::models::Residual)."""

    def __init__(self, in_channels, out_channels, use_1x1conv=False, strides=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, stride=strides)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, padding=1)
        self.conv3 = nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=strides) if use_1x1conv else None
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.bn2 = nn.BatchNorm2d(out_channels)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        if self.conv3 is not None:
            x = self.conv3(x)
        return F.relu(y + x)


def resnet18(num_classes=10, in_channels=1):
    """d2l's slightly modified ResNet-18 ("Concise Implementation for Multiple GPUs"):
    datapar::models::ResNet18. Keys 0.weight, 1.running_mean, resnet_block1.0.conv1.weight,
    ..., fc.1.weight."""

    def resnet_block(in_channels, out_channels, num_residuals, first_block=False):
        blk = []
        for i in range(num_residuals):
            if i == 0 and not first_block:
                blk.append(Residual(in_channels, out_channels, use_1x1conv=True, strides=2))
            else:
                blk.append(Residual(out_channels, out_channels))
        return nn.Sequential(*blk)

    net = nn.Sequential(
        nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU())
    net.add_module("resnet_block1", resnet_block(64, 64, 2, first_block=True))
    net.add_module("resnet_block2", resnet_block(64, 128, 2))
    net.add_module("resnet_block3", resnet_block(128, 256, 2))
    net.add_module("resnet_block4", resnet_block(256, 512, 2))
    net.add_module("global_avg_pool", nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module("fc", nn.Sequential(nn.Flatten(), nn.Linear(512, num_classes)))
    return net


# The C++ class names, for code that builds models by name.
ResNet18 = resnet18
MODELS = {"mlp": Mlp, "lenet": LeNet, "resnet18": resnet18}
