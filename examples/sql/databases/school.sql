CREATE TABLE teachers (
  id INTEGER PRIMARY KEY,
  name TEXT,
  department TEXT,
  hired_year INTEGER
);
CREATE TABLE courses (
  id INTEGER PRIMARY KEY,
  title TEXT,
  teacher_id INTEGER REFERENCES teachers(id),
  credits INTEGER
);
CREATE TABLE students (
  id INTEGER PRIMARY KEY,
  name TEXT,
  grade_level INTEGER,
  city TEXT,
  email TEXT
);
CREATE TABLE enrollments (
  student_id INTEGER REFERENCES students(id),
  course_id INTEGER REFERENCES courses(id),
  score INTEGER
);
INSERT INTO teachers (id, name, department, hired_year) VALUES (1, 'Jonas Silva', 'mathematics', 2015);
INSERT INTO teachers (id, name, department, hired_year) VALUES (2, 'Priya Moreau', 'physics', 2013);
INSERT INTO teachers (id, name, department, hired_year) VALUES (3, 'Grace Larsen', 'history', 2007);
INSERT INTO teachers (id, name, department, hired_year) VALUES (4, 'David Muller', 'physics', 2004);
INSERT INTO teachers (id, name, department, hired_year) VALUES (5, 'Nora Larsen', 'mathematics', 2021);
INSERT INTO teachers (id, name, department, hired_year) VALUES (6, 'Omar Haddad', 'mathematics', 2010);
INSERT INTO teachers (id, name, department, hired_year) VALUES (7, 'Hiro Patel', 'history', 2019);
INSERT INTO teachers (id, name, department, hired_year) VALUES (8, 'Ana Moreau', 'history', 2019);
INSERT INTO teachers (id, name, department, hired_year) VALUES (9, 'Zoe Smith', 'physics', 2001);
INSERT INTO teachers (id, name, department, hired_year) VALUES (10, 'Elena Garcia', 'art', 2015);
INSERT INTO courses (id, title, teacher_id, credits) VALUES (1, 'Algebra', 7, 6);
INSERT INTO courses (id, title, teacher_id, credits) VALUES (2, 'Geometry', 3, 3);
INSERT INTO courses (id, title, teacher_id, credits) VALUES (3, 'Mechanics', 9, 3);
INSERT INTO courses (id, title, teacher_id, credits) VALUES (4, 'Optics', 2, 2);
INSERT INTO courses (id, title, teacher_id, credits) VALUES (5, 'Ancient Rome', 8, 2);
INSERT INTO courses (id, title, teacher_id, credits) VALUES (6, 'Modern Europe', 3, 6);
INSERT INTO courses (id, title, teacher_id, credits) VALUES (7, 'French', 6, 2);
INSERT INTO courses (id, title, teacher_id, credits) VALUES (8, 'Spanish', 7, 2);
INSERT INTO courses (id, title, teacher_id, credits) VALUES (9, 'Drawing', 3, 4);
INSERT INTO courses (id, title, teacher_id, credits) VALUES (10, 'Sculpture', 4, 6);
INSERT INTO courses (id, title, teacher_id, credits) VALUES (11, 'Statistics', 7, 2);
INSERT INTO courses (id, title, teacher_id, credits) VALUES (12, 'Astronomy', 3, 2);
INSERT INTO students (id, name, grade_level, city, email) VALUES (1, 'Vera Haddad', 12, 'Osaka', 'vera.haddad@school.example');
INSERT INTO students (id, name, grade_level, city, email) VALUES (2, 'Hiro Dubois', 12, 'Osaka', 'hiro.dubois@school.example');
INSERT INTO students (id, name, grade_level, city, email) VALUES (3, 'Omar Moreau', 10, 'Krakow', NULL);
INSERT INTO students (id, name, grade_level, city, email) VALUES (4, 'Maya Dubois', 12, 'Austin', 'maya.dubois@school.example');
INSERT INTO students (id, name, grade_level, city, email) VALUES (5, 'Sven Haddad', 10, 'Austin', 'sven.haddad@school.example');
INSERT INTO students (id, name, grade_level, city, email) VALUES (6, 'Umar Silva', 10, 'Porto', NULL);
INSERT INTO students (id, name, grade_level, city, email) VALUES (7, 'Vera Tanaka', 12, 'Lisbon', 'vera.tanaka@school.example');
INSERT INTO students (id, name, grade_level, city, email) VALUES (8, 'Ben Ivanova', 10, 'Porto', NULL);
INSERT INTO students (id, name, grade_level, city, email) VALUES (9, 'Priya Novak', 12, 'Lisbon', 'priya.novak@school.example');
INSERT INTO students (id, name, grade_level, city, email) VALUES (10, 'Ana Okafor', 12, 'Krakow', NULL);
INSERT INTO students (id, name, grade_level, city, email) VALUES (11, 'Rosa Larsen', 11, 'Osaka', 'rosa.larsen@school.example');
INSERT INTO students (id, name, grade_level, city, email) VALUES (12, 'Quinn Chen', 12, 'Dublin', 'quinn.chen@school.example');
INSERT INTO students (id, name, grade_level, city, email) VALUES (13, 'Kira Garcia', 10, 'Austin', NULL);
INSERT INTO students (id, name, grade_level, city, email) VALUES (14, 'Nora Silva', 9, 'Osaka', 'nora.silva@school.example');
INSERT INTO students (id, name, grade_level, city, email) VALUES (15, 'Quinn Okafor', 10, 'Porto', 'quinn.okafor@school.example');
INSERT INTO students (id, name, grade_level, city, email) VALUES (16, 'Elena Okafor', 9, 'Porto', 'elena.okafor@school.example');
INSERT INTO students (id, name, grade_level, city, email) VALUES (17, 'Maya Silva', 9, 'Krakow', 'maya.silva@school.example');
INSERT INTO students (id, name, grade_level, city, email) VALUES (18, 'Zoe Garcia', 11, 'Krakow', NULL);
INSERT INTO students (id, name, grade_level, city, email) VALUES (19, 'Omar Novak', 12, 'Krakow', 'omar.novak@school.example');
INSERT INTO students (id, name, grade_level, city, email) VALUES (20, 'Quinn Larsen', 9, 'Osaka', 'quinn.larsen@school.example');
INSERT INTO students (id, name, grade_level, city, email) VALUES (21, 'Vera Rossi', 11, 'Lyon', 'vera.rossi@school.example');
INSERT INTO students (id, name, grade_level, city, email) VALUES (22, 'Sven Larsen', 11, 'Krakow', 'sven.larsen@school.example');
INSERT INTO students (id, name, grade_level, city, email) VALUES (23, 'Chloe Rossi', 10, 'Osaka', 'chloe.rossi@school.example');
INSERT INTO students (id, name, grade_level, city, email) VALUES (24, 'Ines Novak', 12, 'Dublin', 'ines.novak@school.example');
INSERT INTO students (id, name, grade_level, city, email) VALUES (25, 'Wei Garcia', 10, 'Lyon', 'wei.garcia@school.example');
INSERT INTO students (id, name, grade_level, city, email) VALUES (26, 'Ben Muller', 11, 'Lisbon', 'ben.muller@school.example');
INSERT INTO students (id, name, grade_level, city, email) VALUES (27, 'Rosa Silva', 12, 'Oslo', NULL);
INSERT INTO students (id, name, grade_level, city, email) VALUES (28, 'Yara Tanaka', 12, 'Dublin', 'yara.tanaka@school.example');
INSERT INTO students (id, name, grade_level, city, email) VALUES (29, 'Wei Moreau', 11, 'Porto', NULL);
INSERT INTO students (id, name, grade_level, city, email) VALUES (30, 'Jonas Ivanova', 12, 'Krakow', 'jonas.ivanova@school.example');
INSERT INTO students (id, name, grade_level, city, email) VALUES (31, 'Grace Haddad', 10, 'Porto', 'grace.haddad@school.example');
INSERT INTO students (id, name, grade_level, city, email) VALUES (32, 'Ana Novak', 9, 'Austin', NULL);
INSERT INTO students (id, name, grade_level, city, email) VALUES (33, 'Sven Okafor', 11, 'Krakow', NULL);
INSERT INTO students (id, name, grade_level, city, email) VALUES (34, 'David Rossi', 11, 'Porto', NULL);
INSERT INTO students (id, name, grade_level, city, email) VALUES (35, 'Kira Chen', 9, 'Austin', 'kira.chen@school.example');
INSERT INTO enrollments (student_id, course_id, score) VALUES (1, 4, 43);
INSERT INTO enrollments (student_id, course_id, score) VALUES (1, 12, 72);
INSERT INTO enrollments (student_id, course_id, score) VALUES (2, 3, 86);
INSERT INTO enrollments (student_id, course_id, score) VALUES (2, 9, 100);
INSERT INTO enrollments (student_id, course_id, score) VALUES (3, 1, 40);
INSERT INTO enrollments (student_id, course_id, score) VALUES (3, 4, 42);
INSERT INTO enrollments (student_id, course_id, score) VALUES (3, 7, 82);
INSERT INTO enrollments (student_id, course_id, score) VALUES (4, 8, 55);
INSERT INTO enrollments (student_id, course_id, score) VALUES (4, 10, 51);
INSERT INTO enrollments (student_id, course_id, score) VALUES (4, 12, 50);
INSERT INTO enrollments (student_id, course_id, score) VALUES (5, 2, 58);
INSERT INTO enrollments (student_id, course_id, score) VALUES (5, 3, 64);
INSERT INTO enrollments (student_id, course_id, score) VALUES (5, 12, 63);
INSERT INTO enrollments (student_id, course_id, score) VALUES (6, 1, 94);
INSERT INTO enrollments (student_id, course_id, score) VALUES (6, 2, 87);
INSERT INTO enrollments (student_id, course_id, score) VALUES (6, 3, 81);
INSERT INTO enrollments (student_id, course_id, score) VALUES (6, 7, 76);
INSERT INTO enrollments (student_id, course_id, score) VALUES (7, 1, 45);
INSERT INTO enrollments (student_id, course_id, score) VALUES (7, 5, 43);
INSERT INTO enrollments (student_id, course_id, score) VALUES (7, 11, 60);
INSERT INTO enrollments (student_id, course_id, score) VALUES (8, 2, 66);
INSERT INTO enrollments (student_id, course_id, score) VALUES (8, 3, 74);
INSERT INTO enrollments (student_id, course_id, score) VALUES (8, 8, 54);
INSERT INTO enrollments (student_id, course_id, score) VALUES (8, 9, 75);
INSERT INTO enrollments (student_id, course_id, score) VALUES (9, 9, 67);
INSERT INTO enrollments (student_id, course_id, score) VALUES (9, 12, 45);
INSERT INTO enrollments (student_id, course_id, score) VALUES (10, 2, 91);
INSERT INTO enrollments (student_id, course_id, score) VALUES (12, 2, 92);
INSERT INTO enrollments (student_id, course_id, score) VALUES (12, 9, 95);
INSERT INTO enrollments (student_id, course_id, score) VALUES (13, 2, 88);
INSERT INTO enrollments (student_id, course_id, score) VALUES (13, 10, 84);
INSERT INTO enrollments (student_id, course_id, score) VALUES (13, 12, 55);
INSERT INTO enrollments (student_id, course_id, score) VALUES (14, 4, 69);
INSERT INTO enrollments (student_id, course_id, score) VALUES (14, 6, 49);
INSERT INTO enrollments (student_id, course_id, score) VALUES (15, 3, 53);
INSERT INTO enrollments (student_id, course_id, score) VALUES (15, 8, 90);
INSERT INTO enrollments (student_id, course_id, score) VALUES (15, 9, 71);
INSERT INTO enrollments (student_id, course_id, score) VALUES (15, 11, 54);
INSERT INTO enrollments (student_id, course_id, score) VALUES (16, 9, 81);
INSERT INTO enrollments (student_id, course_id, score) VALUES (17, 5, 71);
INSERT INTO enrollments (student_id, course_id, score) VALUES (17, 6, 62);
INSERT INTO enrollments (student_id, course_id, score) VALUES (17, 9, 66);
INSERT INTO enrollments (student_id, course_id, score) VALUES (18, 1, 75);
INSERT INTO enrollments (student_id, course_id, score) VALUES (18, 8, 78);
INSERT INTO enrollments (student_id, course_id, score) VALUES (19, 1, 87);
INSERT INTO enrollments (student_id, course_id, score) VALUES (19, 2, 100);
INSERT INTO enrollments (student_id, course_id, score) VALUES (19, 3, 83);
INSERT INTO enrollments (student_id, course_id, score) VALUES (19, 4, 54);
INSERT INTO enrollments (student_id, course_id, score) VALUES (19, 7, 77);
INSERT INTO enrollments (student_id, course_id, score) VALUES (19, 8, 44);
INSERT INTO enrollments (student_id, course_id, score) VALUES (19, 11, 89);
INSERT INTO enrollments (student_id, course_id, score) VALUES (19, 12, 95);
INSERT INTO enrollments (student_id, course_id, score) VALUES (20, 4, 54);
INSERT INTO enrollments (student_id, course_id, score) VALUES (20, 12, 45);
INSERT INTO enrollments (student_id, course_id, score) VALUES (21, 6, 75);
INSERT INTO enrollments (student_id, course_id, score) VALUES (22, 1, 99);
INSERT INTO enrollments (student_id, course_id, score) VALUES (22, 2, 57);
INSERT INTO enrollments (student_id, course_id, score) VALUES (22, 5, 45);
INSERT INTO enrollments (student_id, course_id, score) VALUES (22, 11, 95);
INSERT INTO enrollments (student_id, course_id, score) VALUES (22, 12, 43);
INSERT INTO enrollments (student_id, course_id, score) VALUES (23, 6, 80);
INSERT INTO enrollments (student_id, course_id, score) VALUES (23, 8, 92);
INSERT INTO enrollments (student_id, course_id, score) VALUES (23, 9, 81);
INSERT INTO enrollments (student_id, course_id, score) VALUES (23, 10, 62);
INSERT INTO enrollments (student_id, course_id, score) VALUES (24, 1, 59);
INSERT INTO enrollments (student_id, course_id, score) VALUES (24, 7, 52);
INSERT INTO enrollments (student_id, course_id, score) VALUES (24, 8, 51);
INSERT INTO enrollments (student_id, course_id, score) VALUES (24, 11, 82);
INSERT INTO enrollments (student_id, course_id, score) VALUES (25, 1, 49);
INSERT INTO enrollments (student_id, course_id, score) VALUES (25, 2, 51);
INSERT INTO enrollments (student_id, course_id, score) VALUES (25, 3, 95);
INSERT INTO enrollments (student_id, course_id, score) VALUES (25, 6, 44);
INSERT INTO enrollments (student_id, course_id, score) VALUES (25, 11, 96);
INSERT INTO enrollments (student_id, course_id, score) VALUES (26, 3, 56);
INSERT INTO enrollments (student_id, course_id, score) VALUES (26, 9, 94);
INSERT INTO enrollments (student_id, course_id, score) VALUES (27, 3, 58);
INSERT INTO enrollments (student_id, course_id, score) VALUES (27, 4, 46);
INSERT INTO enrollments (student_id, course_id, score) VALUES (27, 5, 72);
INSERT INTO enrollments (student_id, course_id, score) VALUES (27, 9, 66);
INSERT INTO enrollments (student_id, course_id, score) VALUES (27, 12, 41);
INSERT INTO enrollments (student_id, course_id, score) VALUES (28, 3, 45);
INSERT INTO enrollments (student_id, course_id, score) VALUES (28, 11, 82);
INSERT INTO enrollments (student_id, course_id, score) VALUES (29, 1, 43);
INSERT INTO enrollments (student_id, course_id, score) VALUES (29, 2, 47);
INSERT INTO enrollments (student_id, course_id, score) VALUES (31, 8, 78);
INSERT INTO enrollments (student_id, course_id, score) VALUES (31, 9, 43);
INSERT INTO enrollments (student_id, course_id, score) VALUES (31, 10, 90);
INSERT INTO enrollments (student_id, course_id, score) VALUES (31, 12, 61);
INSERT INTO enrollments (student_id, course_id, score) VALUES (32, 1, 65);
INSERT INTO enrollments (student_id, course_id, score) VALUES (32, 4, 97);
INSERT INTO enrollments (student_id, course_id, score) VALUES (32, 5, 48);
INSERT INTO enrollments (student_id, course_id, score) VALUES (34, 3, 65);
INSERT INTO enrollments (student_id, course_id, score) VALUES (34, 6, 99);
INSERT INTO enrollments (student_id, course_id, score) VALUES (34, 11, 42);
INSERT INTO enrollments (student_id, course_id, score) VALUES (34, 12, 82);
INSERT INTO enrollments (student_id, course_id, score) VALUES (35, 2, 58);
INSERT INTO enrollments (student_id, course_id, score) VALUES (35, 6, 71);
INSERT INTO enrollments (student_id, course_id, score) VALUES (35, 11, 76);
