"""Recipes: named architecture + training settings, one YAML file each."""
