"""Head importance: Michel et al. (2019) gradient importance, ablation, Voita et al. (2019) confidence, random.

Every scorer returns a `HeadScores` (one float per head per site of the model's `HeadLayout`); a low score means
"least important, prune first". The scorers work on any supported model without a Trainer, on any device, and under
an initialised `torch.distributed` process group they all-reduce their sums and counts, so every rank gets the scores
a single process would compute over the union of all ranks' batches.

Gradient importance (Michel et al. 2019, eq. 2), with ξ_h the keep value of head h (`HeadMask`):

    I_h = E_x | ∂L(x) / ∂ξ_h |     evaluated at ξ = 1.

What `head_importance` computes exactly, for units u that are batches (`per="batch"`) or examples
(`per="example"`), S_u the summed token loss of unit u and n_u its number of loss tokens:

    I_h = Σ_u |∂S_u/∂ξ_h| / Σ_u n_u   =   Σ_u n_u |∂L_u/∂ξ_h| / Σ_u n_u,     L_u = S_u / n_u,

i.e. the token-weighted mean over units of |∂L_u/∂ξ_h|, L_u the unit's mean token loss.
`per="example"` is the paper's expectation over examples. `per="batch"` is what the authors' released code does:
it accumulates |∂L_b/∂ξ| of the batch-mean loss L_b and divides by the total token count, which for equal-sized
batches is our value divided by the (constant) tokens per batch, a factor that the per-layer normalisation removes.

The modules: `scores` (`HeadScores`), `loop` (the scoring loop the scorers share: batches, loss, frozen parameters,
distributed sums), `gradient` (`head_importance`), `scorers` (ablation, confidence, random) and `registry` (the
`Scorer` protocol, one scorer class per method, `get_scorer` / `register_scorer`).
"""

from prunetrain.methods.importance.gradient import NORMALIZE, PER, REDUCTION, head_importance
from prunetrain.methods.importance.loop import LossFn, batch_to, is_causal_lm, loss_token_count, scoring_mode
from prunetrain.methods.importance.registry import (SCORERS, AblationScorer, ConfidenceScorer, GradientScorer,
                                                    RandomScorer, Scorer, get_scorer, register_scorer)
from prunetrain.methods.importance.scorers import ablation_scores, confidence_scores, random_scores
from prunetrain.methods.importance.scores import NORMALIZE_EPS, HeadScores

# also importable from here as before the split: PER, NORMALIZE, REDUCTION, NORMALIZE_EPS, LossFn, batch_to,
# is_causal_lm
__all__ = [
    "AblationScorer", "ConfidenceScorer", "GradientScorer", "HeadScores", "RandomScorer", "SCORERS", "Scorer",
    "ablation_scores", "confidence_scores", "get_scorer", "head_importance", "loss_token_count", "random_scores",
    "register_scorer", "scoring_mode",
]
