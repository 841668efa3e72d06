"""Looking inside a trained model: attention maps and head statistics, why each token was
chosen (explain), scores over a split (evaluate), and what the model makes of each position of
a reference (score)."""
