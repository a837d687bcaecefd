"""The model's cheaper variants: preprocessing in the graph (uint8 in), INT8, fp16."""
