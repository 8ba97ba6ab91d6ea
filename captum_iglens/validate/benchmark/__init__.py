"""The pre-registered faithfulness benchmark: which per-layer attribution tracks interventions.

:mod:`~captum_iglens.validate.benchmark.decide` reads the pre-registration shipped as
``prereg.json`` beside it (hypotheses, statistics, decision rules) and applies its decision
rule; :mod:`~captum_iglens.validate.benchmark.tasks` generates the tasks offline.
"""
