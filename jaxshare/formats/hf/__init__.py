"""The files of a Hugging Face model directory: names, index, which files hold the weights."""
