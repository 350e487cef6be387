package podget

// DecodePod is decodePod, for the external tests.
var DecodePod = decodePod
