"""``xla-streams tune``: the XLA settings and collective streams that make a program
fastest, found without a GPU. From Python::

    result = xla_streams.tune(build, devices=32, devices_per_host=8, target="h100")
    result.best.xla_flags, result.best.streams, result.best.policy, result.command

``build(devices)`` returns ``(jitted_fn, abstract_args)`` or a ``jax.stages.Lowered``;
``driver.tune_lowered`` takes a Lowered, ``driver.tune_stablehlo`` StableHLO text and
``driver.tune_path`` a ``JAX_DUMP_IR_TO`` folder or a saved ``lowered.as_text()``.
Their keywords are the fields of one ``TuneOptions`` (``options=`` takes one whole).

Each concept has one module, each importing only those above it in this list:

- :mod:`~xla_streams.tuning.levers`: XLA's overlap levers (``Lever``: its names,
  the words of its options, its settings; ``levers()``, ``LEVER_NAMES``), the
  ``CollectiveCensus`` of a module that says which can act (``collective_census``), ``canonical``
  option sets, and the options in words (``describe``).
- :mod:`~xla_streams.tuning.result`: what a search found and its file:
  ``Configuration`` (with the predicted step's range), ``TuneResult`` (schema
  ``xla_streams.tune.v1``: ``to_json``, and ``from_json`` that admits only the
  options of ``xla_options.OPTIONS``, each typed and ranged; ``load_tune_result``),
  ``Dropped``, ``XlaOpinion``, ``TuneError``, the table and the command. Light:
  the plugin reads tune files through it.
- :mod:`~xla_streams.tuning.options`: the tuner's options (``TuneOptions``: each
  field's default, range and help, checked once), from which ``xla-streams tune``
  makes its flags.
- :mod:`~xla_streams.tuning.cache`: the disk cache of compiled candidates (schema
  ``xla_streams.tune_cache.v2``).
- :mod:`~xla_streams.tuning.compiling`: compiling a program's StableHLO deviceless,
  with XLA's own estimate of each compile (its schedule dump), in this process or in
  worker processes (``--jobs``), behind the cache.
- :mod:`~xla_streams.tuning.cluster`: the same on a Ray cluster (``--ray``).
- :mod:`~xla_streams.tuning.sources`: reading JAX's own dump or saved StableHLO.
- :mod:`~xla_streams.tuning.opinion`: the second opinion, XLA's own estimate of
  each compile beside ours, and its line on the recommendation.
- :mod:`~xla_streams.tuning.evaluation`: one compiled option set evaluated: its memory
  (``MemoryUse``), the simulator's predictions for it (``predict``), ``Evaluation``.
- :mod:`~xla_streams.tuning.session`: one search's ``Session``: the budget, the
  progress bar, the compiles and every evaluation. JAX-free: it calls the compiler it
  is given.
- :mod:`~xla_streams.tuning.search`: the search (coordinate descent with joint moves,
  then the check of every one- and two-lever neighbour: ``search``; ``exhaustive``).
- :mod:`~xla_streams.tuning.recommendation`: the recommendation and its ``TuneResult``.
  The method, its guarantee, the memory check and what a prediction assumes:
  docs/tune.md.
- :mod:`~xla_streams.tuning.driver`: the JAX side: ``tune`` (``xla_streams.tune``),
  ``tune_lowered``, ``tune_stablehlo``, ``tune_path``, loading a builder
  (``load_builder``), the topology, the targets and their HBM.

The command line (``define_flags``, ``run_command``) is :mod:`xla_streams.cli.tune`.
No module here is named ``tune``: that is the public function.
"""
