"""The computation: inputs, targets, baselines, capture, estimators, pipeline, onset."""
