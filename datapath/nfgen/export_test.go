package nfgen

// Answer exposes the reply reader to the tests.
var Answer = answer
