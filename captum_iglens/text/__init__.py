"""Prompt -> chat template -> answer -> IG-Lens result (one prompt, a batch, a document).

The public names of ``captum_iglens.text`` are imported on first use (PEP 562)
from :mod:`captum_iglens.text.explain_prompt`.
"""

from captum_iglens._utils.lazy import lazy_exports

__all__ = [
    'DEFAULT_MAX_NEW_TOKENS', 'RenderedPrompt', 'build_prompt_ids', 'render_prompt',
    'generate_answer', 'explain', 'explain_ids', 'target_token_id', 'target_token_ids',
]

__getattr__, __dir__ = lazy_exports(__name__, "captum_iglens.text.explain_prompt", __all__)
