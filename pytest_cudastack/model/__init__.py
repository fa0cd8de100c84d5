"""The models the checks read: the import model, the pip/environment model, module trees, run-time loads and
CUDA needs, computed from the lower floors' facts (``linker``, ``cuda``, ``wheels``) and never from findings."""
