"""``torch.optim.LBFGS``: limited-memory BFGS over all parameters as one flat vector, driven
by ``step(closure)`` (the closure recomputes the loss and its gradients). The search
direction comes from the two-loop recursion over the last ``history_size`` steps; the step
is ``lr`` (the first one scaled by ``min(1, 1 / |g|_1)``), without a line search, as
PyTorch's default. The vectors stay on the parameters' device (float32, or float64 where a
parameter is float64); the scalars of the recursion are read back, one per dot product."""
from __future__ import annotations

import math

import numpy as np

from ..autograd.tape import enable_grad, no_grad
from ..ops import elementwise as E
from ..ops.manipulation import concatenate
from ..ops.reductions import max as _max
from ..ops.reductions import sum as _sum
from .optimizer import Optimizer, _number

__all__ = ["LBFGS"]


def _dot(a, b):
    return float(_sum(E.multiply(a, b)).item())


class LBFGS(Optimizer):
    """``torch.optim.LBFGS(params, lr=1, max_iter=20, max_eval=None, tolerance_grad=1e-7,
    tolerance_change=1e-9, history_size=100, line_search_fn=None)``; one param group."""

    _float64 = True

    def __init__(self, params, lr=1.0, max_iter=20, max_eval=None, tolerance_grad=1e-7,
                 tolerance_change=1e-9, history_size=100, line_search_fn=None):
        if max_eval is None:
            max_eval = max_iter * 5 // 4
        super().__init__(params, dict(lr=lr, max_iter=max_iter, max_eval=max_eval,
                                      tolerance_grad=tolerance_grad,
                                      tolerance_change=tolerance_change,
                                      history_size=history_size, line_search_fn=line_search_fn))
        if len(self.param_groups) != 1:
            raise ValueError("[fastmetal.optim.LBFGS] expected one param group (as PyTorch's), "
                             f"got {len(self.param_groups)}")
        self._params = self.param_groups[0]["params"]
        self._dtype = ("float64" if any(p.dtype == np.float64 for p in self._params)
                       else "float32")

    def _validate(self, g):
        for name in ("lr", "tolerance_grad", "tolerance_change"):
            g[name] = _number(g[name], name, "LBFGS")
        for name in ("max_iter", "max_eval", "history_size"):
            g[name] = int(_number(g[name], name, "LBFGS", 1.0))
        if g["line_search_fn"] is not None:
            raise ValueError("[fastmetal.optim.LBFGS] expected line_search_fn=None (the fixed "
                             "step of PyTorch's default; 'strong_wolfe' is not implemented), "
                             f"got {g['line_search_fn']!r}")
        return g

    def _flat_grad(self):
        dt = self._dtype
        return concatenate([E.copy(p.grad).reshape(-1).astype(dt) if p.grad is not None
                            else E.multiply(p.reshape(-1).astype(dt), 0.0)
                            for p in self._params])

    def _add(self, t, d):
        """p += t * d, each parameter its slice of the flat direction d."""
        offset = 0
        for p in self._params:
            n = p.size
            step = E.multiply(d[offset:offset + n], t).reshape(tuple(p.shape)).astype(p.dtype)
            E.add(p, step, out=p)
            offset += n

    def step(self, closure=None):
        """One LBFGS step (up to ``max_iter`` iterations); returns the closure's first loss."""
        if closure is None:
            raise ValueError("[fastmetal.optim.LBFGS.step] expected a closure (a function "
                             "that recomputes the loss and its gradients), got None")
        group = self.param_groups[0]
        lr, history = group["lr"], group["history_size"]
        tol_grad, tol_change = group["tolerance_grad"], group["tolerance_change"]
        state = self.state.setdefault("lbfgs", {"func_evals": 0, "n_iter": 0})
        with enable_grad():
            orig_loss = closure()
        loss = float(orig_loss.item() if hasattr(orig_loss, "item") else orig_loss)
        evals = 1
        state["func_evals"] += 1
        with no_grad():
            flat_grad = self._flat_grad()
            if float(_max(E.abs(flat_grad)).item()) <= tol_grad:
                return orig_loss
            d, t = state.get("d"), state.get("t")
            old_dirs, old_stps, ro = (state.get(k, []) for k in ("old_dirs", "old_stps", "ro"))
            h_diag = state.get("H_diag", 1.0)
            prev_flat_grad, prev_loss = state.get("prev_flat_grad"), state.get("prev_loss")
            n_iter = 0
            while n_iter < group["max_iter"]:
                n_iter += 1
                state["n_iter"] += 1
                if state["n_iter"] == 1:
                    d = E.negative(flat_grad)
                    old_dirs, old_stps, ro, h_diag = [], [], [], 1.0
                else:
                    y = E.subtract(flat_grad, prev_flat_grad)
                    s = E.multiply(d, t)
                    ys = _dot(y, s)
                    if ys > 1e-10:  # the curvature condition: keep the pair
                        if len(old_dirs) == history:
                            old_dirs.pop(0), old_stps.pop(0), ro.pop(0)
                        old_dirs.append(y)
                        old_stps.append(s)
                        ro.append(1.0 / ys)
                        h_diag = ys / _dot(y, y)
                    # Two-loop recursion: d = -H g.
                    al = [0.0] * len(old_dirs)
                    q = E.negative(flat_grad)
                    for i in range(len(old_dirs) - 1, -1, -1):
                        al[i] = _dot(old_stps[i], q) * ro[i]
                        q = E.subtract(q, E.multiply(old_dirs[i], al[i]))
                    d = E.multiply(q, h_diag)
                    for i in range(len(old_dirs)):
                        be_i = _dot(old_dirs[i], d) * ro[i]
                        d = E.add(d, E.multiply(old_stps[i], al[i] - be_i))
                prev_flat_grad, prev_loss = E.copy(flat_grad), loss
                if state["n_iter"] == 1:
                    t = min(1.0, 1.0 / float(_sum(E.abs(flat_grad)).item())) * lr
                else:
                    t = lr
                if _dot(flat_grad, d) > -tol_change:  # not a descent direction
                    break
                self._add(t, d)
                step_evals = 0
                if n_iter != group["max_iter"]:
                    with enable_grad():
                        value = closure()
                    loss = float(value.item() if hasattr(value, "item") else value)
                    flat_grad = self._flat_grad()
                    step_evals = 1
                evals += step_evals
                state["func_evals"] += step_evals
                if n_iter == group["max_iter"] or evals >= group["max_eval"]:
                    break
                if float(_max(E.abs(flat_grad)).item()) <= tol_grad:
                    break
                if float(_max(E.abs(E.multiply(d, t))).item()) <= tol_change:
                    break
                if abs(loss - prev_loss) < tol_change or math.isnan(loss):
                    break
            state.update(d=d, t=t, old_dirs=old_dirs, old_stps=old_stps, ro=ro, H_diag=h_diag,
                         prev_flat_grad=prev_flat_grad, prev_loss=prev_loss)
        return orig_loss
