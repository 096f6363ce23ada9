"""The package's version, kept at the bottom of the layers so that the plugin and the
command line read it without going through the package's public face."""

__version__ = "0.2.0"
