"""Random-weight Clef releases (`clef-quant make-tiny`): the real folder layout, loadable by transformers and vLLM."""

from clef_quant.tiny.build import make_tiny, parameter_count
from clef_quant.tiny.checks import TinyBuildError
from clef_quant.tiny.sizes import SIZES

__all__ = ["SIZES", "TinyBuildError", "make_tiny", "parameter_count"]
