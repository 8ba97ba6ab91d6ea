"""What IG-Lens needs from a model: families, layout, readout, hooks, model state."""
