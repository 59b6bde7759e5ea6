"""Recipes: YAML files that declare a model pipeline (schema, loading with line marks, matrix expansion)."""
