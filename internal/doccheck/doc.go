// Package doccheck holds no code: its tests check that what the repository's
// comments and documents name exists, so that they stay true as the code
// moves. It checks three things:
//
//   - a Go file named in a Go comment exists in the comment's package (or
//     elsewhere in the repository), and a document under docs/ exists;
//   - a method or field named in a Go comment as Type.name, or
//     (*Type).name, where Type is a type of the comment's package, is one of
//     that type's (types that embed another are skipped: their promoted
//     names are not tracked);
//   - a relative link in a Markdown document points at a file that exists.
package doccheck
