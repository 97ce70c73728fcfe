"""Room: reports — sweeps read back from the MLflow store into tables, plots and paper verdicts.

Owns: ``python -m results report|paper``, the comparison report (``report``, ``plots``, ``store``),
paper-claim verdicts (``paper``, ``grid``, ``theta``), standalone figures (``figures``), and the
committed reports in results/<name>/.

May import: harness.record (the store), harness.config (compose a preset), positional (figures of a
scheme's maths), and the ground.
"""
