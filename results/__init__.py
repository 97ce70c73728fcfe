"""Room: reports — sweeps read back from the MLflow store into tables, plots and paper verdicts.

Owns: ``python -m results report|paper|tune|index``, a sweep read back from the store (``store``: the reader, where
harness/record/store.py is the client that writes) into its data model (``cells``: one ``Cell`` per trained run,
where harness/bench/cells.py's are benchmark shapes), the comparison report (``report``: a sweep's files, as
harness/bench/report.py and harness/pretrained/report.py write their commands' own; ``plots``), each report's
verdict against the baseline (``verdicts``) and where each arm's spread comes from (``spread``), paper-claim
verdicts (``paper``, ``grid``, ``theta``), a tuning sweep's best values (``tune``: the report of the trials
harness/sweep/tune.py runs), standalone figures (``figures``), and the committed reports in results/<name>/.

May import: harness.record (the store), harness.config (compose a preset), positional (figures of a
scheme's maths), and the ground.
"""
