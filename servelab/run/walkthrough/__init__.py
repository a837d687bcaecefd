"""The notebooks' steps as tested library code: each cell is a call or two, every value passed in from the
notebook's parameters cell (nothing here reads notebook globals)."""
