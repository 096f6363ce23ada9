"""The passes, one per file, each a thin ``ModulePass`` over the analyses of
:mod:`xla_streams.streams` or a rewrite of the module; ``base`` holds what they share.

The folder sits at the top of the repository so that the pipeline is visible in
the layout; the build maps it to the package ``xla_streams.passes``. Importing
this package imports no pass: ``xla_streams.pipeline.PASSES`` loads each one on
first use.
"""
