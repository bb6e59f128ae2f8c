"""Deprecated: the translator's old home, kept so that code written against it (`from mtx.translate import
Translator`) goes on working for a while. The translator is mtx.decode.translator now, and `mtx translate`, the
command, is mtx/decode/command.py. Importing this module warns, and it will be removed in a later release.
"""

from __future__ import annotations

import warnings

from mtx.decode.translator import Translation, TranslationStats, Translator, prepare_model, translate_sentences

__all__ = ["Translation", "TranslationStats", "Translator", "prepare_model", "translate_sentences"]

warnings.warn("mtx.translate is deprecated: import Translator and the rest from mtx.decode.translator",
              DeprecationWarning, stacklevel=2)
