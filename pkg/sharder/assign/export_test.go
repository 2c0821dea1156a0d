package assign

// PatchStatus is patchStatus, for the tests against an API server.
var PatchStatus = patchStatus
