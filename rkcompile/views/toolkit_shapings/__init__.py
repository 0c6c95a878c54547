"""TOOLKIT_SHAPINGS: rewrites of the exported graph into forms rknn-toolkit2 2.5.0 builds on
its NPU (docs/deploy.md). Moved as it was; the next commit splits it by family."""
from __future__ import annotations

from rkcompile.views.toolkit_shapings.layouts import (TOOLKIT_SHAPINGS, rank3_tails_as_rank4,
                                                      reshapes_after_elementwise_ops, token_rows_as_sequences,
                                                      transposes_from_splits)

__all__ = ["TOOLKIT_SHAPINGS", "rank3_tails_as_rank4", "reshapes_after_elementwise_ops", "token_rows_as_sequences",
           "transposes_from_splits"]
