"""Shared helpers, the leaves of the package.

Argument types, number formats, lazy exports, progress bars, Captum compatibility and credit
displays. Importing this package imports nothing, so ``iglens --help`` stays light.
"""
