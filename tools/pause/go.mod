// The sandbox (pause) program of the test platform's real node: no dependencies.
module github.com/cozystack/gpu/tools/pause

go 1.26.0
