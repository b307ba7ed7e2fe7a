"""One module a view: a frozen request (the view's options), its clashes judged before torch in
one wording, and one function that the command line, the Python API and the explorer all call."""
