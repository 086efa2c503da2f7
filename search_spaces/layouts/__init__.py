"""The layouts: one point (`Layout`), the dimensions it is made of, the rules that make one legal (each with its
reason), the space of all of them for a model, cluster and length, and the rules of thumb that seed a sweep."""
