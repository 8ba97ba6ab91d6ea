"""The pre-registered faithfulness benchmark: which per-layer attribution tracks interventions.

:mod:`~captum_iglens.validate.benchmark.decide` reads the pre-registration shipped as
``prereg.json`` beside it (hypotheses, statistics, decision rules) and applies its decision
rule; :mod:`~captum_iglens.validate.benchmark.tasks` generates the tasks offline;
:mod:`~captum_iglens.validate.benchmark.measure` runs the interventions (rows of changed
block updates, three units), :mod:`~captum_iglens.validate.benchmark.predict` the
model-based predictors, :mod:`~captum_iglens.validate.benchmark.analysis` the statistics
and decisions, and :mod:`~captum_iglens.validate.benchmark.runner` a (family, task) cell,
its tables, figure and cost model (``iglens benchmark``). ``DEVIATIONS.md`` beside them
lists where the code departs from the file, and why. The lens addendum
``prereg_lenses.json`` (:mod:`~captum_iglens.validate.benchmark.addendum`) pre-states the
readout credit under a tuned and a Jacobian lens, computed and scored on a cell's stored
measurements by :mod:`~captum_iglens.validate.benchmark.lens_rows` (``--lenses``).
"""
