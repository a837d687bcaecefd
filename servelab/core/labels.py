"""The Food-11 classes, in the order of the model's 11 outputs."""

CLASSES: tuple[str, ...] = (
    "Bread",
    "Dairy product",
    "Dessert",
    "Egg",
    "Fried food",
    "Meat",
    "Noodles/Pasta",
    "Rice",
    "Seafood",
    "Soup",
    "Vegetable/Fruit",
)
