"""``fastmetal.nn.optim`` is ``fastmetal.optim`` (its earlier home): this module hands the
import over, so that ``from fastmetal.nn.optim import SGD`` and ``fastmetal.nn.optim.SGD``
are the same objects as ``fastmetal.optim``'s."""
import sys

from .. import optim

sys.modules[__name__] = optim
