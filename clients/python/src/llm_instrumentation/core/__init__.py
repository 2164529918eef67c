"""Model-structure helpers (architecture detection) kept under the 1.3.1 import path."""
