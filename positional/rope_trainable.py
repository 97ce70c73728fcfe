"""RoPE with trainable frequencies θ_i, initialised at base^(−2i/R) (RoFormer Eq. 15).

Su reports that learned θ_i "did not update significantly" (no equation to cite); the drift is logged
so it can be checked on each run:
  pos/theta_rel_change     ‖θ − θ₀‖ / ‖θ₀‖
  pos/theta_max_log_ratio  max_i |log(|θ_i| / θ₀_i)|
  pos/theta_sign_flips     how many θ_i crossed zero (a flip reverses that pair's rotation)
and θ₀ / θ_final are attached to the MLflow run as ``theta.csv``.

Everything else (layout, fraction, eval-time scaling, which applies to the learned θ) is
pos=rope's. θ is 1-D, so harness/module.py puts it in the no-weight-decay group: decay would
pull it towards 0, i.e. towards no rotation. The model's ``_init_weights`` does not touch it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from harness.errors import ConfigError
from positional.rope import Rope


class RopeTrainable(Rope):
    theta0: Tensor  # (R/2,) the starting θ, a buffer
    float64_state = ("inv_freq", "theta0")  # the learned θ and the reference its drift is measured against

    def _register_theta(self, theta0: Tensor) -> None:
        for name in ("resonance", "hope"):
            if getattr(self, name):
                raise ConfigError(
                    f"{name}=true fixes θ (pos=rope's option), but pos=rope_trainable learns θ from "
                    f"its RoPE start; set {name}=false, or use pos=rope {name}=true"
                )
        self.register_buffer("theta0", theta0.clone())  # (R/2,) float64, the reference for the drift
        self.inv_freq = nn.Parameter(theta0.clone())  # (R/2,) θ, learned; float64 like pos=rope's θ

    def theta_at(self, rotated: int) -> Tensor:
        if rotated != self.rotated:  # a learned θ exists for one width only
            raise ConfigError(
                f"pos=rope_trainable learned θ for {self.rotated} rotated dims, not {rotated}; "
                "use pos=rope with attention that rotates vectors of another width"
            )
        return self.inv_freq

    @torch.no_grad()
    def diagnostics(self) -> dict[str, float]:
        theta, theta0 = self.inv_freq, self.theta0
        return {
            "theta_rel_change": float((theta - theta0).norm() / theta0.norm()),
            "theta_max_log_ratio": float((theta.abs() / theta0).log().abs().max()),
            "theta_sign_flips": float((theta <= 0).sum()),
        }

    @torch.no_grad()
    def artifacts(self) -> dict[str, str]:
        pairs = enumerate(zip(self.theta0.tolist(), self.inv_freq.tolist(), strict=True))
        rows = ["i,theta0,theta_final,ratio", *(f"{i},{t0:.10g},{t:.10g},{t / t0:.10g}" for i, (t0, t) in pairs)]
        return {"theta.csv": "\n".join(rows) + "\n"}
