"""Looking inside a trained model: attention maps and head statistics, why each token was
chosen (explain), and scores over a split (evaluate)."""
