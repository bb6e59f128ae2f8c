"""Recipes: YAML in, validated dataclasses out."""
