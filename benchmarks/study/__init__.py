"""The real-scale study: the papers' comparisons trained with `aot train` on the Gutenberg corpus (see README.md)."""
