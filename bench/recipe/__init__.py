"""Training recipes compared run by run, on validation BLEU.

- bench_recipe: a recipe's levers, each variant trained seed by seed beside the recipe.
- bench_plot_validation_curve: validation BLEU against training time, from the runs' logs, as a picture.
"""
